"""Exact steps: pending turns decoded greedily in batched single-token steps, as ``generate``'s
steps compute them.

Many turns take their single-token steps together, one model call per step: the linear
layers run on all rows at once, and attention runs per row over that row's own cache, grown
by ``torch.cat`` exactly as ``DynamicLayer.update`` grows it, with the model's own attention
function (``compat/row_attention.py``). Rows leave at a stop id or at the token budget, and
waiting turns take their places. Each row computes the same functions, on the same shapes,
from the same input bits as a batch-1 ``generate`` step, *provided* the linear kernels give a
row the same bits whatever the number of rows beside it: ``probe.py`` checks that for every
linear weight shape of the model, and the calibration checks the whole computation end to
end on its turns (``calibration.py``); together they make the :class:`~.bounds.ExactMode`.

A pending turn starts from one of two caches:

* **the forward pass's** (:meth:`ExactStage.continue_cached`): its prompt and draft are
  already cached, so the steps cost no prefill. Only the prompt's cache differs from the
  reference's (the forward pass computed it inside the conversation), so each decision is
  read with the ``row_step`` bound the calibration measured; a near tie sends the turn on to
* **the reference's own prefill** (:meth:`ExactStage.decode`), ``generate(prompt,
  max_new_tokens=1)``: the first token, its logits and the prompt's cache, all the
  reference's. From there every logit has the reference's bits, no bound is needed, and an
  exact tie breaks as the reference's ``argmax`` breaks it.

See ``docs/decoding.md``, "Exact steps".
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_memeval.compat.row_attention import (
    RowCaches,
    row_attention,
    row_attention_unavailable,
)
from pytest_memeval.compat.transformers import (
    forward_parameters,
    full_attention_kv,
)
from pytest_memeval.core.records import TurnOutput
from pytest_memeval.decode.fast.bounds import ExactMode
from pytest_memeval.decode.fast.forward import PendingTurn
from pytest_memeval.decode.fast.logits import logit_checks
from pytest_memeval.decode.fast.probe import matmul_modules, weight_name
from pytest_memeval.decode.fast.shared import Stage
from pytest_memeval.decode.reference import (
    ReferenceSteps,
    decode_new_tokens,
    reference_steps,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ExactStage", "ExactTurn"]


def _one_row_at_a_time(forward: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    """``forward(x)`` computed row by row (dimension 0), each row as a batch-1 step has it."""
    import torch

    return torch.cat([forward(x[r : r + 1]) for r in range(x.shape[0])], dim=0)


@contextmanager
def _row_by_row(modules: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Run the block with ``modules`` computing one row at a time (an instance attribute
    ``forward``, which ``nn.Module.__call__`` calls, wraps the one in use), then as before
    (an instance ``forward`` set by someone else, e.g. accelerate's hooks, is put back)."""
    saved = [module.__dict__.get("forward") for module in modules]
    for module in modules:
        module.forward = functools.partial(_one_row_at_a_time, module.forward)
    try:
        yield
    finally:
        for module, before in zip(modules, saved, strict=True):
            if before is None:
                del module.forward
            else:
                module.forward = before


@dataclass(frozen=True)
class ExactTurn:
    """A turn decoded by the exact stage: its new tokens (up to and including a stop id, or
    the token budget's worth) and, when asked for, each step's fp32 logits."""

    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...] = ()


@dataclass
class _Row:
    """A turn in the batch: where its output goes, the token its next step feeds and that
    token's position, its cache per layer (every token before it), its output tokens so
    far (and logits, when kept)."""

    index: int
    position: int
    caches: list[tuple[torch.Tensor, torch.Tensor]]
    feed: int
    tokens: list[int]
    logits: list[torch.Tensor] = field(default_factory=list)


class ExactStage(Stage):
    """Decodes turns in batched single-token steps (see the module docstring): from the
    forward pass's cache, each decision checked against the ``row_step`` bound, and from
    the reference's own prefill, bit for bit, for the rest."""

    @functools.cached_property
    def unavailable(self) -> str | None:
        """Why the exact stage cannot run on this model (``None``: it can), asked once (the
        first ask registers the per-row attention function)."""
        why = row_attention_unavailable(self.loaded.model)
        if why is None and not forward_parameters(self.loaded.model).position_ids:
            return "the model's forward takes no position_ids"
        return why

    def settle(self, pending: Sequence[PendingTurn], mode: ExactMode) -> list[TurnOutput]:
        """Each pending turn's output: continued from the forward pass's cache where every
        decision clears the ``row_step`` bound (when the calibration measured that kind),
        else decoded from its prompt bit for bit (its draft is not needed then: every token
        is decided as the reference decides it)."""
        if not pending:
            return []
        started = time.perf_counter()
        cached: list[ExactTurn | None] = [None] * len(pending)
        if self.bounds.disagreement("row_step").ulps:
            cached = self.continue_cached(pending, mode)
        rest = [n for n, turn in enumerate(cached) if turn is None]
        decoded = iter(self.decode([pending[n].turn.prompt.ids for n in rest], mode))
        turns = [turn if turn is not None else next(decoded) for turn in cached]
        self.stats.exact_turns += len(rest)
        self.stats.exact_cached_turns += len(pending) - len(rest)
        self.seconds.exact += time.perf_counter() - started
        return [decode_new_tokens(self.loaded, t.tokens) for t in turns]

    def continue_cached(
        self, pending: Sequence[PendingTurn], mode: ExactMode, *, keep_logits: bool = False
    ) -> list[ExactTurn | None]:
        """Each pending turn continued greedily in batched steps from its cached prompt and
        draft (the forward pass's cache): its output, or ``None`` where it has no usable
        cache or a decision is inside the ``row_step`` bound (those go to :meth:`decode`).
        Every decision is checked; with ``keep_logits`` (the calibration), none is, and each
        step's logits are kept."""
        starts = {n: self._cached_row(n, p) for n, p in enumerate(pending)}
        usable = deque(n for n, row in starts.items() if row is not None)

        def start(index: int) -> _Row:
            row = starts[index]
            assert row is not None
            return row

        done = self._batched(usable, start, mode, keep_logits, checked=not keep_logits)
        return [done.get(n) for n in range(len(pending))]

    def decode(
        self,
        prompts: Sequence[Sequence[int]],
        mode: ExactMode,
        *,
        keep_logits: bool = False,
        prefilled: Sequence[ReferenceSteps] | None = None,
    ) -> list[ExactTurn]:
        """Greedy decoding of each prompt, bit for bit as the reference call decodes it, up
        to ``mode.rows`` turns per step (the linear layers of ``mode.row_by_row`` row by
        row); with ``keep_logits``, each step's logits too (for the calibration's check).
        ``prefilled``: reference calls on the same prompts that kept their prompt's cache
        (the calibration's): each turn continues from that call's first token, logits and
        cache, the bits its own prefill would compute, instead of computing them again."""

        def start(index: int) -> _Row | ExactTurn:
            call = prefilled[index] if prefilled is not None else None
            row = (
                self._prefilled_row(index, len(prompts[index]), call, keep_logits)
                if call is not None and call.prompt_cache is not None
                else self._prefill(index, prompts[index], keep_logits)
            )
            return row if row is not None else ExactTurn(self._reference(prompts[index]))

        done = self._batched(deque(range(len(prompts))), start, mode, keep_logits, checked=False)
        turns = [done[i] for i in range(len(prompts))]
        assert all(turn is not None for turn in turns)  # unchecked rows always finish
        return [turn for turn in turns if turn is not None]

    def _batched(
        self,
        waiting: deque[int],
        start: Callable[[int], _Row | ExactTurn],
        mode: ExactMode,
        keep_logits: bool,
        *,
        checked: bool,
    ) -> dict[int, ExactTurn | None]:
        """Run the rows ``start`` makes (in ``waiting``'s order, up to ``mode.rows`` at once,
        a waiting one taking each place a finished one leaves) to the end of their turns.
        ``checked``: a row whose decision is inside the ``row_step`` bound leaves at once,
        with ``None`` for its output."""
        why = self.unavailable  # also registers the per-row attention function
        if why is not None:
            raise RuntimeError(f"the exact stage cannot run on this model: {why}")
        rows = max(1, mode.rows)
        alone = [m for m in matmul_modules(self.loaded.model) if weight_name(m) in mode.row_by_row]
        active: list[_Row] = []
        done: dict[int, ExactTurn | None] = {}
        while waiting or active:
            while waiting and len(active) < rows:
                index = waiting.popleft()
                row = start(index)
                if isinstance(row, ExactTurn):
                    done[index] = row
                elif self._finished(row):
                    done[index] = ExactTurn(tuple(row.tokens), tuple(row.logits))
                else:
                    active.append(row)
            if active:
                with _row_by_row(alone):
                    near_ties = self._step(active, keep_logits, checked=checked)
                for row in list(active):
                    if row.index in near_ties:
                        active.remove(row)
                        done[row.index] = None
                        self.stats.exact_cached_near_tie += 1
                    elif self._finished(row):
                        active.remove(row)
                        done[row.index] = ExactTurn(tuple(row.tokens), tuple(row.logits))
        return done

    def _finished(self, row: _Row) -> bool:
        return bool(row.tokens) and (
            row.tokens[-1] in self.stop or len(row.tokens) >= self.max_new_tokens
        )

    def _cached_row(self, index: int, item: PendingTurn) -> _Row | None:
        """A row continuing ``item`` from its cached prompt and draft: its step feeds the last
        of those tokens over the cache of the others (``None``: no complete cache, or not
        plain full-attention layers, or not the forward pass's: ``row_step`` was measured on
        the forward pass's caches only)."""
        context = item.context
        if context is None or not item.complete or not item.forward_cache:
            return None
        layers = full_attention_kv(context.cache)
        if layers is None:
            return None
        r, cut = context.row, slice(context.start, context.start + context.length)
        caches = [(keys[r : r + 1, :, cut], values[r : r + 1, :, cut]) for keys, values in layers]
        return _Row(index, item.length - 1, caches, item.tokens[-1], list(item.draft))

    def _prefill(self, index: int, prompt: Sequence[int], keep_logits: bool) -> _Row | None:
        """The reference's own call for the first token (:func:`reference_steps` with one new
        token): its token, logits and cache (``None`` when the cache is not plain
        full-attention layers)."""
        self.stats.exact_prefills += 1
        call = reference_steps(self.loaded, prompt, 1, keep_prompt_cache=True)
        return self._prefilled_row(index, len(prompt), call, keep_logits)

    @staticmethod
    def _prefilled_row(
        index: int, length: int, call: ReferenceSteps, keep_logits: bool
    ) -> _Row | None:
        """A row continuing a reference call that kept its prompt's cache: its first token
        and that token's logits, and the prompt's keys and values (``None``: no cache kept)."""
        if call.prompt_cache is None:
            return None
        token = call.tokens[0]
        logits = [call.logits[0].cpu()] if keep_logits else []
        return _Row(index, length, list(call.prompt_cache), token, [token], logits)

    def _step(self, active: list[_Row], keep_logits: bool, *, checked: bool) -> set[int]:
        """One batched single-token step: each row's fed token at its own position. With
        ``checked``: the rows (by index) whose decision is inside the ``row_step`` bound,
        left as they were; every other row takes its greedy token."""
        import torch

        device = self.loaded.device
        inputs: dict[str, object] = {
            "input_ids": torch.tensor([[r.feed] for r in active], device=device),
            "position_ids": torch.tensor([[r.position] for r in active], device=device),
            "use_cache": False,
        }
        if forward_parameters(self.loaded.model).logits_to_keep:
            inputs["logits_to_keep"] = 1  # as generate passes it
        caches: RowCaches = [r.caches for r in active]
        with torch.inference_mode(), row_attention(self.loaded.model, caches):
            # As generate reads its next token: the last position's logits in fp32, argmax.
            logits = self.loaded.model(**inputs).logits[:, -1, :].float()
        checks = logit_checks(logits.unsqueeze(1))
        self.stats.exact_steps += 1
        self.stats.exact_tokens += len(active)
        near_ties = set()
        for r, row in enumerate(active):
            best, margin, top = checks.best[r][0], checks.margin[r][0], checks.top[r][0]
            if checked and not self.bounds.trusted("row_step", margin, top):
                near_ties.add(row.index)
                continue
            row.tokens.append(best)
            row.feed = best
            row.position += 1
            if keep_logits:
                row.logits.append(logits[r].cpu())
        return near_ties

    def _reference(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """A turn whose cache cannot be read: the reference call decides it."""
        self.stats.exact_reference += 1
        return tuple(reference_steps(self.loaded, prompt, self.max_new_tokens).tokens)
