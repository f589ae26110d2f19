"""Batch composition for the fast path's forward passes: similar lengths share a batch.

Rows of a forward pass are right-padded to the longest row, and every padded position is
computed like a real one; so the scenarios a decoder has been handed (a prefetch window under
pytest, the whole list in ``memeval bench``) are sorted by length, longest first, and cut
into consecutive runs. Longest first: the first batch is the widest, so a batch that does not
fit in memory fails at once rather than at the end. The rows of the later batched calls (the
verification passes, ``generate``) are cut the same way, in equal shares (:func:`even_batches`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["even_batches", "length_batches", "padded_tokens"]


def length_batches(
    lengths: Sequence[int], batch_size: int, max_batch_tokens: int, min_fill: float = 0.0
) -> list[list[int]]:
    """Indices into ``lengths`` grouped into forward passes: sorted by length, longest first
    (ties in input order), each batch at most ``batch_size`` rows and, unless one row alone
    exceeds it, at most ``max_batch_tokens`` padded tokens (rows x its longest row), and real
    tokens at least ``min_fill`` of its padded tokens (a shorter row starts the next batch)."""
    if batch_size < 1 or max_batch_tokens < 1:
        raise ValueError("batch_size and max_batch_tokens must be >= 1")
    if not 0.0 <= min_fill <= 1.0:
        raise ValueError("min_fill must be between 0 and 1")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    real = 0  # tokens of the last batch's rows
    for i in order:
        batch = batches[-1] if batches else None
        # Sorted longest first: a batch's first row sets its padded width.
        if batch is not None:
            rows, width = len(batch) + 1, lengths[batch[0]]
            if (
                rows <= batch_size
                and rows * width <= max_batch_tokens
                and real + lengths[i] >= min_fill * rows * width
            ):
                batch.append(i)
                real += lengths[i]
                continue
        batches.append([i])
        real = lengths[i]
    return batches


def padded_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> int:
    """Positions the forward passes of ``batches`` compute, padding included."""
    return sum(len(b) * max(lengths[i] for i in b) for b in batches if b)


def even_batches(lengths: Sequence[int], max_rows: int, max_batch_tokens: int) -> list[list[int]]:
    """:func:`length_batches` in equal shares: as few batches as ``max_rows`` allows, each of
    about the same size (139 rows at most 128 a batch: 70 + 69, not 128 + 11), for calls that
    cost per call and per step rather than per row (every call runs as many steps as its
    slowest row, whatever its size)."""
    if not lengths:
        return []
    calls = math.ceil(len(lengths) / max_rows)
    return length_batches(lengths, math.ceil(len(lengths) / calls), max_batch_tokens)
