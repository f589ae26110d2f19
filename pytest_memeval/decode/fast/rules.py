"""How the fast path composes its forward passes, by device kind and dtype: the one place
the batching rules are chosen, each with the measurement behind it.

A forward pass over right-padded rows computes every padded position like a real one. Whether
that is worth it depends on the device:

* **CPU**: a pass is compute-bound, so padding is computation thrown away, and batching pays
  only where it saves per-call overhead. Up to :data:`CPU_BATCH_SIZE` scenarios a pass, each
  pass at least :data:`FORWARD_MIN_FILL` real tokens, and in 16-bit
  (:data:`FORWARD_ALONE_DTYPES`) one scenario a pass.
* **Accelerator** (``cuda``, ``mps``, any device but the CPU): a pass of one short row leaves
  the device idle while padding is nearly free, so passes are filled up to the batch size
  (:data:`ACCELERATOR_BATCH_SIZE`) and the token budget alone: no fill rule, and 16-bit passes
  stay batched. Not yet measured on a GPU: ``memeval gpu-check`` (``tools/gpu_check/``)
  records what the first GPU run must read to confirm or revise these two choices.

:func:`batching_rules` picks the rules; :meth:`BatchingRules.plan` is the batch plan the
decoder runs (:func:`~pytest_memeval.decode.batches.length_batches` under those rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_memeval.decode.batches import length_batches

__all__ = [
    "ACCELERATOR",
    "ACCELERATOR_BATCH_SIZE",
    "CPU",
    "CPU_BATCH_SIZE",
    "DEFAULT_MAX_BATCH_TOKENS",
    "FORWARD_ALONE_DTYPES",
    "FORWARD_MIN_FILL",
    "BatchingRules",
    "batching_rules",
    "device_kind",
]

CPU = "cpu"
ACCELERATOR = "accelerator"

#: Scenarios per forward pass on the CPU (an upper bound; the token budget also applies). With
#: eager attention over a wide batch, 4 beat 1, 8 and 16; with the forward pass's causal sdpa
#: (``forward.FORWARD_ATTENTION``) 4 to 16 cost the same and 32 twice as much (see
#: ``docs/decoding.md``, "Batching and prefetch"): 8 keeps the scheduler's chunks under xdist
#: small.
CPU_BATCH_SIZE = 8
#: Scenarios per forward pass on an accelerator: a wide pass costs about what one row costs
#: while the device is not saturated; 16 is a start, to be sized per card (``docs/gpu.md``,
#: "Sizing batches on a GPU").
ACCELERATOR_BATCH_SIZE = 16
#: Padded tokens per forward pass (batch rows x longest row), bounding activation memory.
DEFAULT_MAX_BATCH_TOKENS = 32768

#: On the CPU, the least share of a forward pass's positions that are real tokens: a shorter
#: row starts the next pass. Padding is computation thrown away, and a CPU pass is
#: compute-bound (bf16 most of all, emulated without native support): 8 scenarios of the
#: smol-oracle benchmark in one pass computed 6256 positions for 3666 tokens, and the forward
#: passes took 1.9x the bench's floor (one pass per scenario); at 90%, 3819 positions. On the
#: demo under ``pytest -n 2`` the passes then hold 1.1 scenarios on average (7.7 before) at the
#: same throughput (15.1 against 16.8 scenarios/s: within the machine's noise).
FORWARD_MIN_FILL = 0.9

#: Dtypes whose forward passes take one scenario each on the CPU. Without native 16-bit
#: arithmetic the CPU emulates these GEMMs and is compute-bound, so batching saves nothing
#: (SmolLM2 bf16, 8 scenarios: 88.7 s in passes of up to 8 similar lengths, 90.9 s for the
#: bench's floor, one scenario a call), while a batched pass's logits and caches drift from
#: ``generate``'s batch-1 prefill and widen the bounds; one scenario alone gets its bits
#: (0 ulp at every ``first``, ``step`` and ``row_step`` position, against 1, 0 and 1.75 ulp
#: batched; near ties went from 21 to 15 turns). See ``docs/decoding.md``, "One scenario a
#: pass".
FORWARD_ALONE_DTYPES = frozenset({"bfloat16", "float16"})


@dataclass(frozen=True)
class BatchingRules:
    """How the fast path composes forward passes on one device kind in one dtype."""

    #: :data:`CPU` or :data:`ACCELERATOR`
    device_kind: str
    #: scenarios a pass by default (a decoder's ``batch_size`` overrides it)
    batch_size: int
    #: the least share of real tokens among a pass's positions (0: no fill rule)
    min_fill: float
    #: one scenario a pass, whatever the batch size
    alone: bool

    def rows(self, batch_size: int | None = None) -> int:
        """Most scenarios a pass holds under these rules with ``batch_size`` (``None``: the
        rules' own)."""
        if self.alone:
            return 1
        return self.batch_size if batch_size is None else batch_size

    def plan(
        self,
        lengths: Sequence[int],
        *,
        batch_size: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> list[list[int]]:
        """Indices of ``lengths`` (token counts of the scenarios' conversations) in forward
        passes, longest first: at most :meth:`rows` scenarios and ``max_batch_tokens`` padded
        tokens a pass, and at least :attr:`min_fill` real tokens."""
        return length_batches(lengths, self.rows(batch_size), max_batch_tokens, self.min_fill)

    def describe(self, batch_size: int | None = None) -> str:
        """One line for a report: ``cpu: up to 8 scenarios a pass, at least 90% real tokens``."""
        rows = self.rows(batch_size)
        words = f"{self.device_kind}: up to {rows} scenario{'s' if rows != 1 else ''} a pass"
        if self.alone:
            words += " (16-bit on the CPU: one scenario a pass)"
        if self.min_fill:
            words += f", at least {self.min_fill:.0%} real tokens"
        else:
            words += ", no fill rule"
        return words


def device_kind(device: str) -> str:
    """:data:`CPU` for a CPU torch device (``cpu``), else :data:`ACCELERATOR` (``cuda:1``,
    ``mps``, or the word ``accelerator`` itself)."""
    return CPU if str(device).split(":")[0] == CPU else ACCELERATOR


def batching_rules(kind: str, dtype: str) -> BatchingRules:
    """The batching rules for a device (``cpu``, ``cuda``, ``cuda:1``, ``mps``, or
    ``accelerator``) and a dtype name (``float32``, ``bfloat16``, ...)."""
    if device_kind(kind) == CPU:
        return BatchingRules(
            CPU, CPU_BATCH_SIZE, FORWARD_MIN_FILL, alone=dtype in FORWARD_ALONE_DTYPES
        )
    return BatchingRules(ACCELERATOR, ACCELERATOR_BATCH_SIZE, 0.0, alone=False)
