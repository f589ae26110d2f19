"""Slices of one run: tags in records, the ``slices`` block of metrics.json, its recount,
slice expressions and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.metrics import Tally
from pytest_memeval.core.records import RecordError, validate_metrics, validate_record
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.core.slices import SliceError, select_slices, slice_table
from pytest_memeval.core.stats import ClusterSums, clustered_rate_with_ci, min_detectable_drop

from ..runfactory import make_record, write_run


def _tagged(sid: str, i: int, tags: list[str], **kw: Any) -> dict[str, Any]:
    return {**make_record(sid, i, **kw), "tags": tags, "meta": {"i": i}}


def _runs() -> list[dict[str, Any]]:
    """Eight scenarios over three tags: door (4), recent (4), long (3, overlapping)."""
    return [
        _tagged("s1", 0, ["query:door", "long"], final_match=True),
        _tagged("s2", 1, ["query:door"], final_match=False, turn_matches=[True, False]),
        _tagged("s3", 2, ["query:door", "long"], final_match=True, chain=["x"]),  # unaligned
        _tagged("s4", 3, ["query:door"], final_match=True),
        _tagged("s5", 4, ["query:recent"], final_match=False, turn_matches=[False, False]),
        _tagged("s6", 5, ["query:recent", "long"], final_match=True),
        _tagged("s7", 6, ["query:recent"], final_match=True),
        _tagged("s8", 7, ["query:recent"], final_match=False),
    ]


def test_records_with_tags_and_meta_pass_and_bad_ones_are_refused() -> None:
    record = _runs()[0]
    assert validate_record(record, "p:1")["tags"] == ["query:door", "long"]
    for change, field, problem in (
        ({"tags": "long"}, "tags", "field 'tags' must be a list, got \"long\""),
        ({"tags": ["a b"]}, "tags", "tag 'a b' has a character"),
        ({"tags": ["x", "x"]}, "tags", "given twice"),
        ({"meta": [1]}, "meta", "field 'meta' must be a JSON object, got [1]"),
        ({"meta": {"x": "y" * 5000}}, "meta", "bytes as JSON (at most 4096)"),
    ):
        with pytest.raises(RecordError) as info:
            validate_record({**record, **change}, "p.jsonl:7")
        assert info.value.field == field and problem in str(info.value)
        assert str(info.value).startswith("p.jsonl:7: scenario 's1': ")


def test_tally_counts_each_slice_with_its_intervals_and_mde() -> None:
    counts = Tally().extend(_runs()).counts()
    slices = counts["slices"]
    assert list(slices) == ["long", "query:door", "query:recent"]
    door = slices["query:door"]
    assert door["n"] == 4 and door["unaligned"] == 1
    assert (door["m1"]["correct"], door["m1"]["total"]) == (3, 4)
    assert door["m1"]["ci95_method"] == "wilson"
    # m2 over the slice's aligned scenarios only (s3 is unaligned): 2 + 1 + 2 of 6 turns.
    assert (door["m2"]["correct"], door["m2"]["total"], door["m2"]["clusters"]) == (5, 6, 3)
    assert door["m2"] == clustered_rate_with_ci(5, ClusterSums.of([(2, 2), (1, 2), (2, 2)]))
    assert door["m1_mde_pp"] is None  # 4 scenarios: nothing is detectable
    recent = slices["query:recent"]
    assert (recent["m2"]["correct"], recent["m2"]["total"]) == (6, 8)
    # 200 scenarios in a slice can detect about 3.9 pp at best (189: 4.1, docs/statistics.md).
    big = Tally().extend(_tagged(f"b{i}", i, ["t"], final_match=True) for i in range(200))
    mde = big.counts()["slices"]["t"]["m1_mde_pp"]
    assert mde == pytest.approx(min_detectable_drop(200) * 100) and 3.8 < mde < 4.0
    assert Tally().extend([make_record("u", 0, final_match=True)]).counts()["slices"] == {}


def test_slices_are_recounted_and_a_changed_slice_is_caught(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _runs(), ckpt="x")
    recounted = recount_run(run)
    metrics = json.loads((run / "metrics.json").read_text("utf-8"))
    assert recounted["slices"] == metrics["slices"]
    metrics["slices"]["query:door"]["m1"]["correct"] = 4
    (run / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    with pytest.raises(RecountError, match=r"slices\['query:door'\]: metrics say"):
        recount_run(run)
    metrics["slices"]["query:door"]["m1"]["correct"] = 3
    metrics["slices"]["ghost"] = metrics["slices"].pop("long")
    (run / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    with pytest.raises(RecountError) as info:
        recount_run(run)
    assert "slices: 'ghost' is claimed, but no record carries that tag" in str(info.value)
    assert "slices: 'long' is missing" in str(info.value)


def test_metrics_written_before_slices_pass_the_recount(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _runs(), ckpt="x")
    metrics = json.loads((run / "metrics.json").read_text("utf-8"))
    del metrics["slices"]
    (run / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    assert recount_run(run)["slices"]["long"]["n"] == 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.update({"bad tag": s["long"]}), "slices"),
        (lambda s: s["long"].pop("m1_mde_pp"), "slices['long'].m1_mde_pp"),
        (lambda s: s["long"]["m2"].update(total="3"), "slices['long'].m2.total"),
        (lambda s: s["long"].update(n=4), "slices['long'].m1.total"),
    ],
)
def test_malformed_slices_are_refused_naming_the_field(change: Any, field: str) -> None:
    doc: dict[str, Any] = json.loads(json.dumps(Tally().extend(_runs()).counts()))
    change(doc["slices"])
    with pytest.raises(RecordError) as info:
        validate_metrics(doc, "m.json", counts_only=True)
    assert info.value.field == field


def test_slice_expressions() -> None:
    known = ["chain:1-10", "chain:11-20", "oracle:close-dropped", "query:door-state"]
    names = lambda exprs: [s.name for s in select_slices(exprs, known)]  # noqa: E731
    assert names([]) == known
    assert names(["chain:*"]) == ["chain:1-10", "chain:11-20"]
    assert names(["query:door-state&oracle:close-dropped", "chain:1-10", "chain:*"]) == [
        "query:door-state&oracle:close-dropped",
        "chain:1-10",
        "chain:11-20",
    ]
    spec = select_slices(["query:door-state&oracle:close-dropped"], known)[0]
    assert spec.holds({"query:door-state", "oracle:close-dropped", "x"})
    assert not spec.holds({"query:door-state"})
    for bad, message in (
        ("nope", "no scenario carries the tag 'nope'; the tags are: chain:1-10, chain:11-20"),
        ("q:*", "matches no tag"),
        ("chain:*&query:door-state", "names each exactly"),
        ("a&", "empty"),
        ("query:door-state&query:door-state", "named twice"),
        ("a b", "has a character"),
    ):
        with pytest.raises(SliceError, match=message):
            select_slices([bad], known)
    with pytest.raises(SliceError, match=r"the tags are: none \(no scenario has tags\)"):
        select_slices(["x"], [])


def test_slice_table_reads_like_the_summary() -> None:
    lines = slice_table(Tally().extend(_runs()).counts()["slices"])
    assert lines[0] == "slices (3 tags; a scenario counts in every slice it is tagged with):"
    header, door = lines[1], next(line for line in lines if "query:door " in line)
    assert header.split()[:4] == ["slice", "n", "m1", "final-query"]
    assert "3/4 = 75.00%" in door and "5/6 = 83.33%" in door and door.rstrip().endswith("n/a")
    assert "(clustered, 3 scenarios)" in door
    assert slice_table({}) == []
