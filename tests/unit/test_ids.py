"""The scenario id <-> pytest id mapping (pytest_memeval.core.ids) and its check at load."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_memeval.core.benchmark import BenchmarkError, from_records
from pytest_memeval.core.ids import (
    MAX_PLAIN,
    IdCollision,
    IdMap,
    item_name,
    param_id,
    split_item_name,
)

from ..conftest import demo_records

# What pytest leaves unescaped and `-k` accepts inside one name, minus ":" (a "::" would
# split a node id), "[", "]" (they delimit the parameter) and "\\" (pytest escapes it).
SAFE = re.compile(r"[A-Za-z0-9_.+\-]+")

any_id = st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=250)


@pytest.mark.parametrize("sid", ["s0001", "val-3", "a.b+c_d", "X" * MAX_PLAIN])
def test_plain_ids_are_their_own_pytest_id(sid: str) -> None:
    assert param_id(sid) == sid


@pytest.mark.parametrize(
    ("sid", "slug"),
    [
        ("café 1", "cafe_1"),
        ("Straße:3", "Stra_e_3"),
        ("a/b#2 [x]", "a_b_2_x"),
        ("x::y", "x_y"),
        ("ΩΩΩ", "id"),
        ("s" * (MAX_PLAIN + 1), "s" * 40),
    ],
)
def test_odd_ids_get_a_readable_slug_and_a_hash(sid: str, slug: str) -> None:
    pid = param_id(sid)
    assert re.fullmatch(re.escape(slug) + r"-[0-9a-f]{10}", pid), pid


@given(any_id)
def test_pytest_ids_are_safe_deterministic_and_map_back(sid: str) -> None:
    pid = param_id(sid)
    assert SAFE.fullmatch(pid) and pid == param_id(sid)
    id_map = IdMap([sid, "s0001"])
    for function in ("test_final_query", "test_turns"):
        name = item_name(function, sid)
        assert name == f"{function}[{pid}]"
        assert id_map.scenario_of(name) == sid
        assert id_map.scenario_of(f"tests/sub dir/test_eval.py::{name}") == sid
        assert id_map.scenario_of(f"test_eval.py::TestX::{name}") == sid


@given(st.lists(any_id, min_size=2, max_size=20, unique=True))
def test_distinct_ids_get_distinct_pytest_ids(ids: list[str]) -> None:
    assert len({param_id(sid) for sid in ids}) == len(ids)


def test_other_items_map_to_no_scenario() -> None:
    id_map = IdMap(["s1", "café 1"])
    assert id_map.scenario_of("test_x.py::test_plain") is None
    assert id_map.scenario_of("test_x.py::test_final_query[s2]") is None
    assert id_map.scenario_of("test_x.py::test_final_query[café 1]") is None  # raw, not pytest id
    assert split_item_name("test_x.py::test_final_query") is None
    assert split_item_name("a.py::test_turns[s1]") == ("test_turns", "s1")


def test_a_collision_is_refused_naming_both_ids() -> None:
    # A plain id spelled like another id's pytest id: the one case two ids could collide.
    twin = param_id("café 1")
    with pytest.raises(IdCollision, match="café 1"):
        IdMap(["café 1", twin])
    records = demo_records("oracle", 2)
    records[0]["id"], records[1]["id"] = "café 1", twin
    with pytest.raises(BenchmarkError) as err:
        from_records(records, "bench")
    message = str(err.value)
    assert "bench record 2" in message and repr(twin) in message and "'café 1'" in message
