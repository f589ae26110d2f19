"""--memeval-shard K/N: contiguous, even, order-keeping slices of the benchmark."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_memeval.core.sharding import (
    ShardError,
    parse_shard,
    select_shard,
    shard_bounds,
    shard_scope,
    shard_slice,
)

from ..conftest import MemevalProject


def _check_partition(n: int, shards: int) -> None:
    items = [f"s{i:04d}" for i in range(n)]
    slices = [shard_slice(items, k, shards) for k in range(1, shards + 1)]
    # Concatenated in shard order they are the benchmark: disjoint, covering, order kept.
    assert [x for s in slices for x in s] == items
    sizes = [len(s) for s in slices]
    assert max(sizes) - min(sizes) <= 1
    # The larger shards come first (sizes never grow with K).
    assert sizes == sorted(sizes, reverse=True)
    for k, s in enumerate(slices, start=1):
        start, stop = shard_bounds(n, k, shards)
        assert items[start:stop] == s


def test_every_small_case_is_a_partition() -> None:
    for n in range(0, 80):
        for shards in range(1, 25):
            _check_partition(n, shards)


@given(n=st.integers(min_value=0, max_value=6000), shards=st.integers(min_value=1, max_value=300))
def test_any_size_is_a_partition(n: int, shards: int) -> None:
    _check_partition(n, shards)


def test_the_seeds_split() -> None:
    """189 scenarios over 8 shards = 24 x 5 + 23 x 3, as the seed's hand-made fan-out had."""
    ids = [str(i) for i in range(189)]
    assert [len(shard_slice(ids, k, 8)) for k in range(1, 9)] == [24] * 5 + [23] * 3


@pytest.mark.parametrize(
    ("text", "expected"), [("1/8", (1, 8)), ("8/8", (8, 8)), (" 3 / 4 ", (3, 4)), ("1/1", (1, 1))]
)
def test_parse_shard(text: str, expected: tuple[int, int]) -> None:
    assert parse_shard(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0/8", "numbered from 1"),
        ("9/8", "K must be in 1..8"),
        ("1/0", "at least 1"),
        ("3", "expected K/N"),
        ("a/b", "expected K/N"),
        ("-1/2", "expected K/N"),
    ],
)
def test_bad_shard_is_refused(text: str, message: str) -> None:
    with pytest.raises(ShardError, match=message):
        parse_shard(text)


def test_an_empty_shard_is_refused() -> None:
    ids = ["a", "b", "c"]
    assert select_shard(ids, "3/3") == (["c"], (3, 3))
    with pytest.raises(ShardError, match=r"3 scenario\(s\), so shard 4 of 4 would be empty"):
        select_shard(ids, "4/4")


def test_shard_scope_says_what_it_covers() -> None:
    ids = [f"s{i}" for i in range(10)]
    assert shard_scope(ids, None) is None
    assert shard_scope(ids, (2, 3)) == {
        "spec": "2/3",
        "index": 2,
        "count": 3,
        "start": 4,
        "stop": 7,
        "size": 3,
        "first": "s4",
        "last": "s6",
        "benchmark_total": 10,
    }


@pytest.mark.slow
def test_bad_shard_option_is_a_usage_error(memeval_project: MemevalProject) -> None:
    # A replay profile: refusing the shard needs the benchmark, not a model.
    memeval_project.write(n=3, profiles=REPLAY)
    (memeval_project.path / "preds.jsonl").write_text("", "utf-8")
    for shard, message in [
        (
            "4/4",
            "*--memeval-shard 4/4: the benchmark has 3 scenario(s), so shard 4 of 4 would be "
            "empty; use at most 3 shards*",
        ),
        ("0/3", "*--memeval-shard 0/3: shards are numbered from 1, so K must be in 1..3*"),
    ]:
        result = memeval_project.run("--ckpt", "fixed", "--memeval-shard", shard)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([message])
    assert not (memeval_project.path / "runs").exists()


REPLAY = """
[tool.memeval.ckpt.fixed]
kind = "replay"
predictions = "preds.jsonl"
benchmark = "bench.jsonl"
"""
