"""Sharding across hosts: ``--memeval-shard K/N`` runs the K-th of N contiguous slices.

Shards are numbered from 1 (``1/8`` .. ``8/8``, as ``sbatch --array=1-8`` numbers its tasks).
The slices follow benchmark order and are as even as possible: the first ``n % N`` shards get
one scenario more (189 over 8 = 24 x 5 + 23 x 3). Concatenating the shards in order gives the
benchmark back, which is what ``memeval merge`` (:mod:`pytest_memeval.tools.merge`) relies on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from pytest_memeval.core.records import ShardScope

__all__ = [
    "ShardError",
    "describe_shard",
    "parse_shard",
    "shard_bounds",
    "shard_dir_name",
    "shard_scope",
    "shard_slice",
]

T = TypeVar("T")


class ShardError(ValueError):
    """A malformed ``K/N`` or a shard that would be empty."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"3/8"`` -> ``(3, 8)``; 1 <= K <= N."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise ShardError(f"--memeval-shard {text!r}: expected K/N, e.g. 1/8 (shard K of N)")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ShardError(f"--memeval-shard {text}: the number of shards must be at least 1")
    if not 1 <= k <= n:
        raise ShardError(
            f"--memeval-shard {text}: shards are numbered from 1, so K must be in 1..{n}"
        )
    return k, n


def shard_bounds(total: int, k: int, n: int) -> tuple[int, int]:
    """``[start, stop)`` positions of shard ``k`` (1-based) of ``n`` over ``total`` items."""
    if total < 0 or n < 1 or not 1 <= k <= n:
        raise ValueError(f"bad shard {k}/{n} of {total}")
    size, extra = divmod(total, n)
    start = (k - 1) * size + min(k - 1, extra)
    return start, start + size + (1 if k <= extra else 0)


def shard_slice(items: Sequence[T], k: int, n: int) -> list[T]:
    """The items of shard ``k`` of ``n`` (may be empty when there are fewer items than shards)."""
    start, stop = shard_bounds(len(items), k, n)
    return list(items[start:stop])


def select_shard(ids: Sequence[str], text: str) -> tuple[list[str], tuple[int, int]]:
    """Parse ``--memeval-shard`` and return the shard's ids; an empty shard is an error."""
    k, n = parse_shard(text)
    chosen = shard_slice(ids, k, n)
    if not chosen:
        raise ShardError(
            f"--memeval-shard {k}/{n}: the benchmark has {len(ids)} scenario(s), so shard {k} "
            f"of {n} would be empty; use at most {len(ids)} shards"
        )
    return chosen, (k, n)


def shard_dir_name(k: int, n: int) -> str:
    """The default run directory of a shard, under ``runs/<ckpt>/``."""
    return f"shard-{k}-of-{n}"


def shard_scope(ids: Sequence[str], shard: tuple[int, int] | None) -> ShardScope | None:
    """``metrics["scope"]["shard"]`` of a shard run: which slice of the benchmark it covers.

    ``ids`` are the whole benchmark's ids in order. ``start``/``stop`` are 0-based positions
    (``stop`` exclusive); ``memeval merge`` checks them against the records it merges.
    """
    if shard is None:
        return None
    k, n = shard
    start, stop = shard_bounds(len(ids), k, n)
    return {
        "spec": f"{k}/{n}",
        "index": k,
        "count": n,
        "start": start,
        "stop": stop,
        "size": stop - start,
        "first": ids[start] if stop > start else None,
        "last": ids[stop - 1] if stop > start else None,
        "benchmark_total": len(ids),
    }


def describe_shard(ids: Sequence[str], shard: tuple[int, int]) -> str:
    """One header line: ``shard 2/8: scenarios 25-48 of 189 (s024 .. s047)``."""
    scope = shard_scope(ids, shard)
    assert scope is not None
    return (
        f"memeval: shard {scope['spec']}: scenarios {scope['start'] + 1}-{scope['stop']} of "
        f"{scope['benchmark_total']} ({scope['first']} .. {scope['last']})"
    )
