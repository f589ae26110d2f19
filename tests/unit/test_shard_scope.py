"""``scope.shard`` of a shard run's metrics: what sharding writes, records checks (merge)."""

from __future__ import annotations

import pytest

from pytest_memeval.core.records import RecordError, validate_shard_scope
from pytest_memeval.core.sharding import shard_scope


def test_what_sharding_writes_passes_the_check() -> None:
    ids = [f"s{i}" for i in range(7)]
    block = shard_scope(ids, (2, 3))
    assert block is not None
    assert validate_shard_scope(dict(block), "metrics.json") == block
    assert (block["start"], block["stop"], block["first"], block["last"]) == (3, 5, "s3", "s4")
    empty = shard_scope(["s0"], (2, 2))  # more shards than scenarios: an empty shard
    assert empty is not None and empty["first"] is None
    assert validate_shard_scope(dict(empty), "metrics.json") == empty


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"size": "3"}, "scope.shard.size", "must be an integer"),
        ({"index": True}, "scope.shard.index", "must be an integer"),
        ({"first": 3}, "scope.shard.first", "must be a string or null"),
        ({"count": None}, "scope.shard.count", "must be an integer"),
    ],
)
def test_a_wrong_field_is_named(change: dict[str, object], field: str, problem: str) -> None:
    block = dict(shard_scope(["a", "b", "c"], (1, 2)) or {}) | change
    with pytest.raises(RecordError) as info:
        validate_shard_scope(block, "run/metrics.json")
    assert info.value.field == field
    assert str(info.value).startswith("run/metrics.json: ") and problem in str(info.value)


def test_a_missing_field_or_a_non_object_is_named() -> None:
    block = dict(shard_scope(["a", "b"], (1, 2)) or {})
    del block["stop"]
    with pytest.raises(RecordError, match=r"missing field 'scope\.shard\.stop'"):
        validate_shard_scope(block, "m.json")
    with pytest.raises(RecordError, match=r"'scope\.shard' must be a JSON object"):
        validate_shard_scope("1/2", "m.json")
