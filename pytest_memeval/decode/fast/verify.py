"""The verification rounds: pending turns settled by cached forward passes over a guessed
continuation, with the two computations they use (packed and cut).

A turn pending after the forward pass whose draft ends with the model's own token (it left
the truth with a clear margin) gets a guessed continuation (``answers.py``). One cached
forward pass over ``[last draft token, *guess]`` computes, at every guessed position, the
logits greedy decoding sees if the guess is right so far: greedy decoding is proven to
produce each argmax whose margin clears the ``verify`` bound while every earlier guessed
token was produced (:func:`accept`). A turn whose accepted tokens reach a stop id or
``max_new_tokens`` is settled; the others continue from the longer draft, in the next round
(up to :data:`VERIFY_ROUNDS`), then in ``generate``. The pass runs *packed* over the forward
passes' caches as they are (:meth:`Verifier.packed_pass`) or, where it cannot, over cut
caches (:meth:`Verifier.cut_pass`). See ``docs/decoding.md``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.segment_attention import (
    segment_attention,
    segment_attention_unavailable,
)
from pytest_memeval.compat.transformers import (
    KVCache,
    dynamic_cache,
    forward_parameters,
    lm_forward,
)
from pytest_memeval.core.records import TurnOutput
from pytest_memeval.decode.batches import even_batches
from pytest_memeval.decode.fast.answers import AnswerIndex
from pytest_memeval.decode.fast.bounds import Bounds
from pytest_memeval.decode.fast.forward import PendingTurn, ProvenOutputs
from pytest_memeval.decode.fast.kvcache import (
    CacheSlice,
    PackedSource,
    cut_inputs,
    flatten,
    pack,
    packed_source,
)
from pytest_memeval.decode.fast.logits import Checks, Segment, logit_checks
from pytest_memeval.decode.fast.shared import Shared, Stage

if TYPE_CHECKING:
    import torch

__all__ = ["VERIFY_ROUNDS", "Acceptance", "Continuation", "Verifier", "VerifyPass", "accept"]

#: Rounds of the verification pass per pool of turns: each round checks a guessed
#: continuation of every still-open turn in one batched cached forward pass; what it cannot
#: settle continues from the longer draft in the next round, then in ``generate``.
VERIFY_ROUNDS = 3


@dataclass(frozen=True)
class Acceptance:
    """What one row of a verification pass proves."""

    #: tokens greedy decoding produces after the draft
    tokens: tuple[int, ...]
    #: they end the turn (a stop id, or the token budget)
    settled: bool
    #: the last is the model's own token where it left the guess
    left_guess: bool


def accept(
    drafted: int,
    guess: Sequence[int],
    checks: Checks,
    *,
    bounds: Bounds,
    stop: frozenset[int],
    max_new_tokens: int,
) -> Acceptance:
    """Read one row of a pass fed ``[last draft token, *guess]`` after a draft of
    ``drafted`` tokens: position ``k`` (after the draft and ``guess[:k]``) counts only while
    every earlier position produced its guessed token, and only where its margin clears the
    ``verify`` bound (a near tie decides nothing: ``generate`` decides it, guarded)."""
    accepted: list[int] = []
    for k in range(len(guess) + 1):
        if not bounds.trusted("verify", checks.margin[k], checks.top[k]):
            return Acceptance(tuple(accepted), settled=False, left_guess=False)
        got = checks.best[k]
        accepted.append(got)
        if got in stop or drafted + len(accepted) >= max_new_tokens:
            # Where greedy ``generate`` stops: the first stop id, or the token budget
            # (counted from the answer's start, the draft included).
            return Acceptance(tuple(accepted), settled=True, left_guess=False)
        if k == len(guess) or got != guess[k]:
            return Acceptance(tuple(accepted), settled=False, left_guess=True)
    raise AssertionError("unreachable: the last position always returns")


@dataclass(frozen=True)
class Continuation:
    """A turn's cached tokens (``context``), then ``tokens`` fed after them."""

    context: CacheSlice
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class _Guessed:
    """A turn of the pool (its index) to verify this round, and its guessed continuation."""

    turn: int
    guess: tuple[int, ...]


@dataclass(frozen=True)
class VerifyPass:
    """One verification pass: per continuation, where its fed tokens' fp32 logits are
    (``segments`` of ``logits``); a cut pass's cache and the column where each
    continuation's tokens start in it (a packed pass keeps no cache: ``None``)."""

    logits: torch.Tensor
    segments: list[Segment]
    cache: KVCache | None
    starts: list[int]

    def checks(self) -> list[Checks]:
        """Per continuation, the greedy checks at its fed tokens."""
        checks = logit_checks(self.logits)
        return [checks.segment(s) for s in self.segments]

    def logits_of(self, n: int) -> torch.Tensor:
        """Continuation ``n``'s fp32 logits, one row per fed token (on the CPU)."""
        s = self.segments[n]
        return self.logits[s.row, s.start : s.start + s.length].cpu()


class Verifier(Stage):
    """Runs the verification rounds over pools of pending turns."""

    def __init__(
        self,
        shared: Shared,
        *,
        proven: ProvenOutputs,
        answers: AnswerIndex,
        rows_per_call: int,
        max_batch_tokens: int,
    ) -> None:
        super().__init__(shared)
        self.proven = proven
        self.answers = answers
        self.rows_per_call = rows_per_call
        self.max_batch_tokens = max_batch_tokens
        # Both computations number positions explicitly (each row from its own length).
        self.can_verify = forward_parameters(shared.loaded.model).position_ids

    def settle(self, pool: Sequence[PendingTurn]) -> list[TurnOutput | PendingTurn]:
        """Per turn of ``pool``, its output where the rounds settle it, else the turn as the
        rounds leave it (a longer draft, another cache: where ``generate`` continues from)."""
        started = time.perf_counter()
        turns = list(pool)
        outcomes: list[TurnOutput | None] = [None] * len(pool)
        if self._rounds(turns, outcomes):
            rest = [n for n, out in enumerate(outcomes) if out is None]
            for n, refilled in zip(rest, self.refill([turns[n] for n in rest]), strict=True):
                turns[n] = refilled
        else:
            # The cache cannot be cut: ``generate`` decides (from the full prompt), for a
            # turn whose cache lacks its grown draft.
            turns = [t if t.complete or t.context is None else t.cached(None) for t in turns]
        self.seconds.verify += time.perf_counter() - started
        return [t if out is None else out for t, out in zip(turns, outcomes, strict=True)]

    def _rounds(self, turns: list[PendingTurn], outcomes: list[TurnOutput | None]) -> bool:
        """Up to :data:`VERIFY_ROUNDS` rounds over ``turns`` (:meth:`_round`); whether the
        caches could be cut."""
        # A draft that is a prefix of the truth ended at a near tie (or is empty): that
        # decision is ``generate``'s, as without the verification pass.
        left = [i for i, p in enumerate(turns) if p.left_truth and p.context is not None]
        open_turns = left if self.can_verify else []
        for _ in range(VERIFY_ROUNDS):
            # A draft grown by a packed pass is fed again from where its cache ends.
            work = [
                _Guessed(i, g)
                for i in open_turns
                if (g := self.answers.guess(turns[i].draft, turns[i].turn.expected))
                or not turns[i].complete
            ]
            if not work:
                break
            still_open = self._round(turns, work, outcomes)
            if still_open is None:
                return False
            open_turns = still_open
        return True

    def _round(
        self,
        pool: list[PendingTurn],
        work: list[_Guessed],
        outcomes: list[TurnOutput | None],
    ) -> list[int] | None:
        """One round over ``work``: settles what it can into ``outcomes``, puts in ``pool``
        the turns whose drafts it grew (new ones); the turns to guess again, or ``None``
        when the caches cannot be cut."""
        fed = [self._continuation(pool[w.turn], (*pool[w.turn].unheld, *w.guess)) for w in work]
        # Packed passes read the forward passes' caches as they are (no copies); cut
        # passes, in chunks, only where they cannot.
        packed = self.packed_pass(fed)
        chunks = (
            [list(range(len(work)))]
            if packed is not None
            else even_batches(
                [pool[w.turn].length + len(w.guess) for w in work],
                self.rows_per_call,
                self.max_batch_tokens,
            )
        )
        still_open: list[int] = []
        for chunk in chunks:
            verified = packed if packed is not None else self.cut_pass([fed[k] for k in chunk])
            if verified is None:
                return None
            for r, (k, checks) in enumerate(zip(chunk, verified.checks(), strict=True)):
                i, guess = work[k].turn, work[k].guess
                item = pool[i]
                got = self._read(item, guess, checks)
                if got.settled:
                    # ``generated``: the model left the truth here, whichever computation
                    # proved its answer (the pass or ``generate``: that depends on how turns
                    # were pooled, which must not change a record).
                    outcomes[i] = self.proven([*item.draft, *got.tokens], generated=True)
                elif got.tokens:
                    pool[i] = item.grown_by(got.tokens)
                    if verified.cache is not None:
                        # a cut pass's row holds the turn's tokens from its start column on
                        end = pool[i].length - 1
                        pool[i] = pool[i].cached(
                            CacheSlice(verified.cache, r, verified.starts[r], end)
                        )
                    if got.left_guess:
                        still_open.append(i)
        return still_open

    @staticmethod
    def _continuation(item: PendingTurn, tokens: tuple[int, ...]) -> Continuation:
        """``tokens`` fed after ``item``'s cached ones."""
        assert item.context is not None  # only turns with a cache are verified or refilled
        return Continuation(item.context, tokens)

    def _read(self, item: PendingTurn, guess: tuple[int, ...], checks: Checks) -> Acceptance:
        """What one row of a pass proves for ``item`` (:func:`accept`), counted."""
        # Only the positions after the draft decide (the ones before re-feed a draft grown
        # by a packed pass).
        skip = len(checks) - len(guess) - 1
        self.stats.verify_refed += skip > 0
        got = accept(
            len(item.draft),
            guess,
            checks.after(skip),
            bounds=self.bounds,
            stop=self.stop,
            max_new_tokens=self.max_new_tokens,
        )
        self.stats.verify_tokens += len(got.tokens)
        if got.settled:
            self.stats.verified += 1
            # the guess accepted to its end (else the model's own stop ended it)
            self.stats.verified_guess += tuple(guess) == got.tokens
            self.stats.verified_at_budget += got.tokens[-1] not in self.stop
        else:
            # left the guess: counted once per turn, whatever the round
            self.stats.verify_left_guess += got.left_guess and not item.grown
        return got

    def refill(self, pending: Sequence[PendingTurn]) -> list[PendingTurn]:
        """``pending``, the turns whose drafts packed passes grew given a cache holding their
        prompt and draft but its last token, for ``generate`` to continue from: one cut pass
        over the draft tokens the forward pass's cache lacks (its decisions unused)."""
        refilled = list(pending)
        short = [n for n, p in enumerate(pending) if p.context is not None and not p.complete]
        lengths = [pending[n].length for n in short]
        for chunk in even_batches(lengths, self.rows_per_call, self.max_batch_tokens):
            rows = [short[k] for k in chunk]
            verified = self.cut_pass(
                [self._continuation(pending[n], pending[n].unheld[:-1]) for n in rows]
            )
            for r, n in enumerate(rows):
                refilled[n] = pending[n].cached(
                    CacheSlice(verified.cache, r, verified.starts[r], pending[n].length - 1)
                    if verified is not None and verified.cache is not None
                    else None  # ``generate`` from the full prompt
                )
        return refilled

    def cut_pass(self, rows: Sequence[Continuation]) -> VerifyPass | None:
        """One batched cached forward pass over cut caches: row ``r`` continues its
        context, copied right-aligned (left padding, as for ``generate``), with its tokens
        from a common column on (right padding after them); the mask hides both paddings and
        each row's positions continue from its own length, as ``generate`` numbers them.
        ``None`` when the caches cannot be cut."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        if not self.can_verify:
            return None
        cut = cut_inputs([c.context for c in rows], [c.tokens for c in rows], self.loaded.pad_id)
        if cut is None:
            return None
        self.stats.verify_passes += 1
        device = self.loaded.device
        with torch.inference_mode():
            inputs = {
                "input_ids": cut.input_ids.to(device),
                "attention_mask": cut.attention_mask.to(device),
                "position_ids": cut.position_ids.to(device),
            }
            out = lm_forward(self.loaded.model, inputs, cache=cut.cache)
            # In fp32, as ``generate`` upcasts its next-token logits before the argmax.
            logits = out.logits.float()
        segments = [Segment(r, 0, len(c.tokens)) for r, c in enumerate(rows)]
        return VerifyPass(logits, segments, out.cache, [cut.width - c.context.length for c in rows])

    def packed_pass(self, rows: Sequence[Continuation]) -> VerifyPass | None:
        """What :meth:`cut_pass` computes for the same continuations (each from column 0 of
        a forward pass's cache), without cutting any cache: one pass over the caches as they
        are, in one row with segment attention where the model allows it
        (:func:`~.kvcache.flatten`), else each row fed the tokens of all the turns it holds
        (:func:`~.kvcache.pack`). The pass's cache is not kept. ``None`` when the caches are
        not plain full-attention ones."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        if not self.can_verify or not rows or any(not c.tokens for c in rows):
            return None
        contexts = [c.context for c in rows]
        source = packed_source(contexts)
        if source is None:
            return None
        self.stats.verify_passes += 1
        self.stats.verify_packed_passes += 1
        if self.segments_unavailable is None:
            return self._flat_pass(rows, source)
        packed = pack(contexts, [c.tokens for c in rows], source, self.loaded.pad_id)
        device = self.loaded.device
        with torch.inference_mode():
            inputs = {
                "input_ids": packed.input_ids.to(device),
                "attention_mask": packed.mask.to(device),
                "position_ids": packed.positions.to(device),
            }
            # a new cache object over the same tensors: its update concatenates into new
            # ones, so the forward pass's cache stays as later turns need it
            out = lm_forward(self.loaded.model, inputs, cache=dynamic_cache(source.layers))
            # In fp32, as ``generate`` upcasts its next-token logits before the argmax.
            logits = out.logits.float()
        return VerifyPass(logits, packed.segments, None, [0] * len(rows))

    @functools.cached_property
    def segments_unavailable(self) -> str | None:
        """Why the packed pass cannot run in one row with segment attention (``None``: it
        can), asked once per model."""
        return segment_attention_unavailable(self.loaded.model)

    def _flat_pass(self, rows: Sequence[Continuation], source: PackedSource) -> VerifyPass:
        """The packed pass in one row, no padding: each conversation's turns a group of
        segment attention over its cache row as it is (``compat/segment_attention.py``;
        no cache copied, no key repeated per query head)."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        flat = flatten([c.context for c in rows], [c.tokens for c in rows], source)
        device = self.loaded.device
        inputs = {
            "input_ids": flat.input_ids.to(device),
            "position_ids": flat.positions.to(device),
            "use_cache": False,
        }
        with (
            torch.inference_mode(),
            segment_attention(self.loaded.model, source.layers, flat.groups),
        ):
            # In fp32, as ``generate`` upcasts its next-token logits before the argmax.
            logits = self.loaded.model(**inputs).logits.float()
        return VerifyPass(logits, flat.segments, None, [0] * len(rows))
