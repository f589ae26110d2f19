"""Pooled cached ``generate``: the turns no pass settled, generated greedily from their drafts.

Each turn continues from its prompt and draft with the keys and values its context holds
(cut out of a forward or verification pass's cache: the history is not run again), many
turns per batched call (left padding, as any batched ``generate``), each with its own
remaining token budget. A step whose margin is below the ``generate`` bound in a decision
that shaped the output is not trusted: that turn is decoded again by the reference call
itself, as is every turn whose cache cannot be cut.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.transformers import generate_with_logits, vocab_size
from pytest_memeval.core.records import TurnOutput
from pytest_memeval.decode.batches import even_batches
from pytest_memeval.decode.fast.forward import PendingTurn
from pytest_memeval.decode.fast.kvcache import CacheSlice, left_padded_cache
from pytest_memeval.decode.fast.logits import Checks, logit_checks
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.decode.reference import decode_new_tokens, generate_from, greedy_settings

if TYPE_CHECKING:
    import torch

__all__ = [
    "GENERATE_LOGITS_BYTES",
    "GENERATE_ROWS",
    "GenerateCall",
    "GenerateRow",
    "Generator",
    "rows_per_call",
]

#: Rows per batched ``generate`` call, and turns pooled over consecutive forward passes before
#: generating (``max_batch_tokens`` also bounds a call: rows x longest row). A generate step
#: feeds one token per row, so its cost is mostly per call and per step, not per row: on the
#: demo, 128 rows per call spend half the CPU time of 16.
GENERATE_ROWS = 128
#: Bytes of per-step logits one ``generate`` call may hold for the margin guard
#: (``output_logits``: rows x steps x vocabulary in fp32, and a stacked copy): fewer rows per
#: call where the vocabulary or ``max_new_tokens`` is large (Qwen's 151,936 tokens at 16
#: steps: 55 rows; the demo's 54 tokens: :data:`GENERATE_ROWS`).
GENERATE_LOGITS_BYTES = 1 << 30


def rows_per_call(max_new_tokens: int, vocabulary: int) -> int:
    """Rows per batched ``generate`` call (and turns pooled before generating): at most
    :data:`GENERATE_ROWS`, and at most what keeps the call's logits within
    :data:`GENERATE_LOGITS_BYTES`."""
    per_row = max_new_tokens * max(1, vocabulary) * 4 * 2
    return max(1, min(GENERATE_ROWS, GENERATE_LOGITS_BYTES // per_row))


def used_tokens(new: Sequence[int], stop: frozenset[int]) -> list[int]:
    """Generated tokens up to and including the first stop id."""
    used = next((k + 1 for k, t in enumerate(new) if t in stop), len(new))
    return list(new[:used])


@dataclass(frozen=True)
class GenerateRow:
    """``tokens`` (a prompt, then ``drafted`` tokens already decided) to continue, with the
    cached keys and values of all but the last of them (``context``)."""

    context: CacheSlice
    tokens: tuple[int, ...]
    drafted: int


@dataclass(frozen=True)
class GenerateCall:
    """One batched ``generate``: per row its new tokens, and per row and step the fp32
    next-token logits (``rows x steps x vocabulary``)."""

    tokens: list[list[int]]
    logits: torch.Tensor

    def checks(self) -> list[Checks]:
        """Per row, the greedy checks of each step."""
        checks = logit_checks(self.logits)
        return [checks.row(r) for r in range(len(self.tokens))]

    def logits_of(self, row: int) -> torch.Tensor:
        """Row ``row``'s step logits (``steps x vocabulary``, on the CPU)."""
        return self.logits[row].cpu()


class Generator(Stage):
    """Generates pending turns in pooled, cached, batched ``generate`` calls."""

    def __init__(
        self, shared: Shared, *, max_batch_tokens: int, grow_in_place: bool = True
    ) -> None:
        super().__init__(shared)
        self.max_batch_tokens = max_batch_tokens
        #: each call's cache has room for the positions it feeds, written in place
        #: (``compat.transformers.growing_cache``); ``False``: concatenated at every step, as
        #: ``DynamicCache`` does (what the in-place cache is checked against, bit for bit:
        #: ``tests/integration/test_families.py``)
        self.grow_in_place = grow_in_place
        #: rows per call (see :func:`rows_per_call`)
        self.rows_per_call = rows_per_call(shared.max_new_tokens, vocab_size(shared.loaded.model))

    def generate(self, pending: Sequence[PendingTurn]) -> list[TurnOutput]:
        """Each turn's output, continuing from its draft and context."""
        if not pending:
            return []
        self.stats.generate_turns += len(pending)
        self.stats.generate_grown_drafts += sum(p.grown for p in pending)
        started = time.perf_counter()
        results: dict[int, TurnOutput] = {}
        lengths = [p.length for p in pending]
        for chunk in even_batches(lengths, self.rows_per_call, self.max_batch_tokens):
            outs = self._generate_chunk([pending[k] for k in chunk])
            results.update(zip(chunk, outs, strict=True))
        self.seconds.generate += time.perf_counter() - started
        return [results[k] for k in range(len(pending))]

    def _generate_chunk(self, rows: Sequence[PendingTurn]) -> list[TurnOutput]:
        self.stats.generate_calls += 1
        call = None
        if all(p.complete for p in rows):
            call = self.run(
                [
                    GenerateRow(p.context, p.tokens, len(p.draft))
                    for p in rows
                    if p.context is not None
                ]
            )
        if call is None:
            self.stats.generated_without_cache += len(rows)
            return [self._reference(p) for p in rows]
        results = []
        for p, new, checks in zip(rows, call.tokens, call.checks(), strict=True):
            # Only this row's budget counts (rows continue from drafts of different lengths),
            # and only the steps that decided its output: up to and including its first stop.
            used = used_tokens(new[: self.max_new_tokens - len(p.draft)], self.stop)
            if not all(
                self.bounds.trusted("generate", checks.margin[k], checks.top[k])
                for k in range(len(used))
            ):
                # A near tie in a batched, cached computation: the reference call decides it.
                self.stats.generated_reference_rerun += 1
                results.append(self._reference(p))
            else:
                results.append(decode_new_tokens(self.loaded, [*p.draft, *used]))
        return results

    def _reference(self, item: PendingTurn) -> TurnOutput:
        return generate_from(self.loaded, item.turn.prompt.ids, self.max_new_tokens)

    def run(self, rows: Sequence[GenerateRow]) -> GenerateCall | None:
        """One batched greedy ``generate`` over ``rows``: only each row's last token and the
        new ones are computed. ``None`` when the caches cannot be cut."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        steps = self.max_new_tokens - min(row.drafted for row in rows)
        # Room for every position the call feeds (the last prompt token, then each new token
        # but the last), written in place rather than concatenated at every step.
        room = steps if self.grow_in_place else 0
        prefix = left_padded_cache([row.context for row in rows], room=room)
        if prefix is None:
            return None
        width = max(len(row.tokens) for row in rows)
        # Left padding, as for any batched ``generate``: every input ends at the same column,
        # the mask hides the padding and ``generate`` derives each row's positions from it.
        input_ids = torch.full((len(rows), width), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            input_ids[r, width - len(row.tokens) :] = torch.tensor(row.tokens, dtype=torch.long)
            mask[r, width - len(row.tokens) :] = 1
        device = self.loaded.device
        with torch.inference_mode():
            settings = {
                "input_ids": input_ids.to(device),
                "attention_mask": mask.to(device),
                "max_new_tokens": steps,
                **greedy_settings(self.loaded),
            }
            out = generate_with_logits(self.loaded.model, settings, cache=prefix)
            logits = torch.stack([step.float() for step in out.logits], dim=1)
        sequences = out.sequences[:, width:].cpu()
        return GenerateCall([[int(t) for t in sequences[r]] for r in range(len(rows))], logits)
