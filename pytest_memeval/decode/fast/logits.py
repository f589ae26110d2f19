"""Greedy decisions read off a block of logits: argmax, top-1/top-2 margin and top logit.

Every computation the fast path runs (the forward pass, the verification passes, pooled
``generate``) hands its logits to :func:`logit_checks`, in fp32 as ``generate`` upcasts its
next-token logits before taking the ``argmax`` (so exact ties break the same way), and reads
the result as plain lists: the checks downstream index them thousands of times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Checks", "LogitChecks", "Segment", "logit_checks"]


@dataclass(frozen=True)
class Checks:
    """Greedy's decisions at a run of positions: per position the argmax token, the
    top-1/top-2 logit margin and the top logit."""

    best: Sequence[int]
    margin: Sequence[float]
    top: Sequence[float]

    def __len__(self) -> int:
        return len(self.best)

    def after(self, skip: int) -> Checks:
        """The positions from ``skip`` on."""
        return Checks(self.best[skip:], self.margin[skip:], self.top[skip:])


@dataclass(frozen=True)
class Segment:
    """Positions ``start .. start + length - 1`` of row ``row`` of a block of logits."""

    row: int
    start: int
    length: int


@dataclass(frozen=True)
class LogitChecks:
    """:class:`Checks` of every row of a ``rows x positions x vocabulary`` block."""

    best: list[list[int]]
    margin: list[list[float]]
    top: list[list[float]]

    def row(self, row: int) -> Checks:
        """All positions of ``row`` (no copy)."""
        return Checks(self.best[row], self.margin[row], self.top[row])

    def segment(self, segment: Segment) -> Checks:
        """The positions of ``segment``."""
        end = segment.start + segment.length
        return Checks(
            self.best[segment.row][segment.start : end],
            self.margin[segment.row][segment.start : end],
            self.top[segment.row][segment.start : end],
        )


def logit_checks(logits: torch.Tensor) -> LogitChecks:
    """:class:`LogitChecks` of ``logits`` (``rows x positions x vocabulary``, fp32), computed
    where the logits are, then moved to plain lists."""
    # Deferred: torch takes seconds to import; only a model run needs it.
    import torch

    with torch.inference_mode():
        best = logits.argmax(-1)
        top = logits.topk(2, dim=-1).values
        margin = top[..., 0] - top[..., 1]
        # torch types ``tolist`` as a bare ``list``: nested lists of ints (argmax) and of
        # floats (fp32 values), by the tensors' dtypes.
        return LogitChecks(best.cpu().tolist(), margin.cpu().tolist(), top[..., 0].cpu().tolist())
