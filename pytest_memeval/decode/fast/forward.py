"""The teacher-forced batch pass: one forward pass over whole conversations, and what it proves.

Every turn's prompt is a prefix of its conversation (``plan.py``), so one forward pass over
the conversation computes, at each answer position, the logits greedy decoding sees *if* it
produced the truth so far. Greedy decoding reproduces the truth when the argmax at every
answer position is the truth token and the argmax after it a stop id, each decision clear of
a tie (``bounds.py``); then the output is the truth. Elsewhere the turn is pending: greedy
decoding is proven to produce its draft first (the truth up to where the model leaves it,
plus the model's own token there when that decision is clear), and it continues from the
pass's cache (``verify.py``, then ``generate.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.attention import (
    attention_implementation,
    can_switch_attention,
    switched_attention,
)
from pytest_memeval.compat.transformers import (
    KVCache,
    forward_parameters,
    lm_forward,
    output_rows,
)
from pytest_memeval.core.records import TurnOutput
from pytest_memeval.decode.fast.bounds import Kind
from pytest_memeval.decode.fast.kvcache import CacheSlice
from pytest_memeval.decode.fast.logits import Checks, LogitChecks, logit_checks
from pytest_memeval.decode.fast.plan import ScenarioPlan, TurnPlan
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.decode.reference import decode_new_tokens
from pytest_memeval.model.loading import LoadedModel

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORWARD_ATTENTION",
    "FORWARD_ATTENTION_DTYPES",
    "ForwardDecisions",
    "ForwardPass",
    "ForwardStage",
    "PendingTurn",
    "ProvenOutputs",
    "forward_attention_for",
]

#: The attention implementation of the fast path's forward passes, by the one the model was
#: loaded with (any other: unchanged), in the dtypes of :data:`FORWARD_ATTENTION_DTYPES`.
#: Eager attention materialises batch x heads x width^2 scores; sdpa without a padding mask
#: (see :meth:`ForwardStage.run`) runs a causal kernel that does not. Measured on the demo
#: (189 scenarios, fp32, 2 threads, forward passes alone): 0.73-0.88 s eager at
#: batch 4, 0.40-0.45 s sdpa at batch 4-16 (0.83 s at 32). A different computation of the same
#: logits: the calibration measures it (kinds ``first``/``step`` compare this pass's logits
#: with the reference call's, ``generate`` its cache's use) and the margin guard bounds it.
FORWARD_ATTENTION: dict[str, str] = {"eager": "sdpa"}
#: Where the switch applies: in 16-bit the guard counts ulps and assumes (PRIOR_ULPS) that the
#: forward pass and ``generate``'s prefill mostly agree bit for bit, which the same kernel
#: gives; another kernel there was not measured.
FORWARD_ATTENTION_DTYPES = frozenset({"float32", "float64"})


def forward_attention_for(loaded: LoadedModel, requested: str | None) -> str | None:
    """The attention implementation of the forward passes: ``requested``, or for ``"auto"``
    :data:`FORWARD_ATTENTION`'s choice where the dtype and architecture allow it; ``None``:
    the one the model was loaded with."""
    if requested != "auto":
        return requested
    wanted = FORWARD_ATTENTION.get(attention_implementation(loaded.model) or "")
    if (
        wanted is not None
        and loaded.dtype in FORWARD_ATTENTION_DTYPES
        and can_switch_attention(loaded.model, wanted)
    ):
        return wanted
    return None


class ProvenOutputs:
    """The :class:`TurnOutput` of tokens a pass proved greedy decoding produces, decoded as
    the reference decodes generated tokens, memoised: the same answers recur across turns and
    scenarios, and decoding is a pure function of the tokens."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self._decoded: dict[tuple[int, ...], TurnOutput] = {}

    def __call__(self, tokens: Sequence[int], *, generated: bool) -> TurnOutput:
        """``generated``: whether the model left the truth in these tokens (the record's
        ``generated``), whichever computation proved them."""
        key = tuple(tokens)
        out = self._decoded.get(key)
        if out is None:
            out = dataclasses.replace(decode_new_tokens(self.loaded, key), generated=False)
            self._decoded[key] = out
        return dataclasses.replace(out, generated=True) if generated else out


@dataclass(frozen=True)
class PendingTurn:
    """A turn the forward pass did not settle: greedy decoding continues from ``draft``.

    Immutable: a stage that proves more of the turn (a verification round grows its draft,
    gives it a cut cache) hands on a new one (``dataclasses.replace``)."""

    #: where its output goes: row and turn of its forward pass
    row: int
    turn_no: int
    turn: TurnPlan
    #: tokens greedy decoding is proven to produce first
    draft: tuple[int, ...]
    #: the cached keys and values of the turn's first tokens (its prompt, then its draft),
    #: all but the last when :attr:`complete`; ``None``: no cache to continue from
    context: CacheSlice | None
    #: True once a verification pass made ``draft`` longer
    grown: bool = False
    #: whether :attr:`context` was computed by this stage's forward pass (the cache the
    #: ``row_step`` bound is measured on), not by a cut pass (free-running rounds)
    forward_cache: bool = True

    @property
    def tokens(self) -> tuple[int, ...]:
        """Prompt and draft."""
        return (*self.turn.prompt.ids, *self.draft)

    @property
    def length(self) -> int:
        return len(self.turn.prompt.ids) + len(self.draft)

    @property
    def complete(self) -> bool:
        """Whether :attr:`context` holds every token but the last (what ``generate`` and a
        cut pass continue from); a packed pass that grew the draft leaves it shorter."""
        return self.context is not None and self.context.length == self.length - 1

    @property
    def unheld(self) -> tuple[int, ...]:
        """The tokens after those :attr:`context` holds."""
        held = 0 if self.context is None else self.context.length
        return self.tokens[held:]

    @property
    def left_truth(self) -> bool:
        """Whether the draft left the truth (ends with the model's own token); an empty
        draft, or one stopped at a near tie while on the truth, did not."""
        return self.draft != self.turn.expected[: len(self.draft)]

    def grown_by(self, tokens: tuple[int, ...]) -> PendingTurn:
        """This turn with ``tokens`` proven after its draft (its cache as it was)."""
        return dataclasses.replace(self, draft=(*self.draft, *tokens), grown=True)

    def cached(self, context: CacheSlice | None) -> PendingTurn:
        """This turn continuing from ``context`` (``None``: from its full prompt)."""
        return dataclasses.replace(self, context=context)


@dataclass(frozen=True)
class ForwardPass:
    """One forward pass over a batch of plans: the greedy checks at every answer position
    (``columns[row]``: position -> column of ``checks`` and ``logits`` in that row), the fp32
    logits there (for the calibration) and the pass's cache."""

    plans: Sequence[ScenarioPlan]
    checks: LogitChecks
    columns: Sequence[Mapping[int, int]]
    logits: torch.Tensor
    cache: KVCache | None

    def logits_at(self, row: int, position: int) -> torch.Tensor:
        """The fp32 logits after ``position`` of row ``row``."""
        return self.logits[row, self.columns[row][position]]


@dataclass(frozen=True)
class ForwardDecisions:
    """What a forward pass decided: per row and turn the output where it proved it
    (``None`` elsewhere), and the turns left pending; the pass's cache (row ``r`` holds its
    plan's ``full`` from column 0; a free-running round continues from it, ``history.py``)."""

    outputs: tuple[tuple[TurnOutput | None, ...], ...]
    pending: tuple[PendingTurn, ...]
    cache: KVCache | None = None

    def settled(self, outputs: Iterable[TurnOutput]) -> list[list[TurnOutput | None]]:
        """Per row, every turn's output: those the pass proved, and ``outputs`` (one per
        pending turn, in :attr:`pending`'s order) for the others; new lists."""
        rows = [list(row) for row in self.outputs]
        for item, output in zip(self.pending, outputs, strict=True):
            rows[item.row][item.turn_no] = output
        return rows


def _own_positions(needed: Sequence[Sequence[int]], union: Sequence[int]) -> torch.Tensor:
    """Per row, where its own answer positions are among ``union`` (``rows x k``; a row with
    fewer repeats its last, computed and never read): the output projection then runs on
    each row's positions only, not on every row's. On a batch of 8 the union was 3-4 times
    a row's, and the projection onto a 49k vocabulary a fifth of a real model's forward
    pass (SmolLM2-135M)."""
    import torch

    at = {pos: i for i, pos in enumerate(union)}
    index = torch.zeros((len(needed), max(1, *(len(row) for row in needed))), dtype=torch.long)
    for row, wanted in enumerate(needed):
        cols = [at[pos] for pos in wanted] or [0]
        index[row] = torch.tensor(cols + [cols[-1]] * (index.shape[1] - len(cols)))
    return index


class ForwardStage(Stage):
    """Runs forward passes over batches of plans and reads the teacher-forced checks."""

    def __init__(self, shared: Shared, *, attention: str | None, proven: ProvenOutputs) -> None:
        super().__init__(shared)
        #: the attention implementation of the passes (``None``: the model's own)
        self.attention = attention
        self.proven = proven

    def run(self, plans: Sequence[ScenarioPlan]) -> ForwardPass:
        """One forward pass over ``plans`` (right-padded rows), keeping the logits at the
        positions whose decisions the checks read: the one before each expected token."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        device = self.loaded.device
        width = max(len(p.full) for p in plans)
        ids = torch.full((len(plans), width), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(plans), width), dtype=torch.long)
        for row, plan in enumerate(plans):
            ids[row, : len(plan.full)] = torch.tensor(plan.full, dtype=torch.long)
            mask[row, : len(plan.full)] = 1
        needed = [
            sorted({len(t.prompt.ids) - 1 + j for t in plan.turns for j in range(len(t.expected))})
            for plan in plans
        ]
        # No padding mask: rows are right-padded and attention is causal, so a real position
        # only ever sees real positions before it; the padding's outputs are never read (no
        # logit is kept there, no generate reuses its cache). Without a mask, sdpa runs its
        # causal kernel instead of materialising batch x heads x width^2 scores.
        inputs: dict[str, object] = {"input_ids": ids.to(device)}
        parameters = forward_parameters(self.loaded.model)
        if parameters.position_ids:
            # What ``generate`` passes (positions from the mask): with right padding every
            # real token gets its own index, exactly as in the reference path's prefill.
            inputs["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0).to(device)
        union = sorted({pos for row in needed for pos in row})
        columns: list[dict[int, int]] = [{pos: pos for pos in union} for _ in plans]
        picked = None
        if parameters.logits_to_keep and union:
            inputs["logits_to_keep"] = torch.tensor(union, dtype=torch.long, device=device)
            columns = [{pos: i for i, pos in enumerate(union)} for _ in plans]
            picked = _own_positions(needed, union).to(device)
        started = time.perf_counter()
        with (
            torch.inference_mode(),
            switched_attention(self.loaded.model, self.attention),
            output_rows(self.loaded.model, picked)
            if picked is not None
            else nullcontext(False) as hooked,
        ):
            out = lm_forward(self.loaded.model, inputs)
            logits = out.logits.float()
            checks = logit_checks(logits)
        if hooked:
            columns = [{pos: k for k, pos in enumerate(wanted)} for wanted in needed]
        self.seconds.forward += time.perf_counter() - started
        return ForwardPass(plans, checks, columns, logits, out.cache)

    def decide(self, passed: ForwardPass) -> ForwardDecisions:
        """Each turn's output where the pass proves what greedy decoding yields; the other
        turns pending, with their drafts and the pass's cache."""
        outputs: list[list[TurnOutput | None]] = [[None] * len(p.turns) for p in passed.plans]
        pending: list[PendingTurn] = []
        for row, plan in enumerate(passed.plans):
            checks = passed.checks.row(row)
            for n, turn in enumerate(plan.turns):
                self.stats.turns += 1
                decided = self.teacher_forced(turn, checks, passed.columns[row])
                if isinstance(decided, TurnOutput):
                    outputs[row][n] = decided
                    continue
                context = None
                if passed.cache is not None:
                    context = CacheSlice(
                        passed.cache, row, 0, len(turn.prompt.ids) + len(decided) - 1
                    )
                pending.append(PendingTurn(row, n, turn, decided, context))
        return ForwardDecisions(tuple(map(tuple, outputs)), tuple(pending), passed.cache)

    def teacher_forced(
        self, turn: TurnPlan, checks: Checks, column: Mapping[int, int], *, cached: bool = False
    ) -> TurnOutput | tuple[int, ...]:
        """The turn's output if the pass proves what greedy decoding yields; else its draft.

        ``cached``: the logits come from a cached continuation (a cut pass, as the
        verification pass computes: a free-running round, ``history.py``), whose decisions
        are read with the ``verify`` bound; else from this stage's forward pass (``first``
        for an answer's first token, ``step`` after it)."""
        if not turn.expected:
            self.stats.generated_no_truth += 1
            return ()
        start = len(turn.prompt.ids)
        produced: list[int] = []
        for j, want in enumerate(turn.expected):
            col = column[start - 1 + j]
            got = checks.best[col]
            kind: Kind = "verify" if cached else ("first" if j == 0 else "step")
            if not self.bounds.trusted(kind, checks.margin[col], checks.top[col]):
                self.stats.generated_near_tie += 1
                return tuple(produced)
            produced.append(got)
            last_stop = turn.ends_with_stop and j == len(turn.expected) - 1
            # Any stop id ends the turn the same way; elsewhere only the truth token will do.
            if got != want and not (last_stop and got in self.stop):
                self.stats.generated_mismatch += 1
                if got in self.stop or len(produced) >= self.max_new_tokens:
                    # The model's own token ends the turn: the forward pass decided it all.
                    self.stats.forward_only += 1
                    return self.proven(produced, generated=False)
                return tuple(produced)
        self.stats.teacher_forced += 1
        return self.proven(produced, generated=False)
