"""Scenario tags and meta: the grammar, the benchmark's check, the scene_memory builder's tags."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import (
    BenchmarkError,
    dump_record,
    from_records,
    load_jsonl,
    parse_record,
    training_format,
)
from pytest_memeval.core.builders import scene_memory
from pytest_memeval.core.tags import (
    MAX_DISTINCT_TAGS,
    MAX_META_BYTES,
    MAX_TAG_CHARS,
    MAX_TAGS,
    check_tags,
    slice_order,
    tag_problem,
)

from ..conftest import DEMO, REPO
from ..runfactory import conv

RECORD = {"id": "a", "messages": conv("pick mug from counter"), "memory_chain": ["pick mug"]}


@pytest.mark.parametrize(
    "tag", ["long", "query:door-state", "chain:1-10", "lang:한국어", "src/v2.1+fix@x", "_x"]
)
def test_valid_tags(tag: str) -> None:
    assert tag_problem(tag) is None


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("", "must not be empty"),
        ("a b", "no spaces"),
        ("-x", "first"),
        ("query:door=1", "no ="),
        ("a,b", "no ="),
        ("a&b", "no ="),
        ("query:*", "no ="),
        ("x" * (MAX_TAG_CHARS + 1), f"at most {MAX_TAG_CHARS}"),
        (3, "must be a string"),
    ],
)
def test_invalid_tags_say_why(tag: object, why: str) -> None:
    problem = tag_problem(tag)
    assert problem is not None and why in problem


def test_tags_list_checks() -> None:
    assert check_tags(["a", "b:c"]) == ("a", "b:c")
    with pytest.raises(ValueError, match="must be a list"):
        check_tags("a")
    with pytest.raises(ValueError, match=r"tags\[1\]': tag 'a' is given twice"):
        check_tags(["a", "a"])
    with pytest.raises(ValueError, match=f"at most {MAX_TAGS}"):
        check_tags([f"t{i}" for i in range(MAX_TAGS + 1)])


def test_slice_order_groups_by_key_and_sorts_numbers_by_value() -> None:
    tags = ["chain:11-20", "query:b", "chain:101-110", "chain:1-10", "long", "query:a", "chain:2-9"]
    assert slice_order(tags + ["long"]) == [
        "chain:1-10",
        "chain:2-9",
        "chain:11-20",
        "chain:101-110",
        "long",
        "query:a",
        "query:b",
    ]


def test_a_benchmark_record_carries_tags_and_meta() -> None:
    obj = {**RECORD, "tags": ["query:x", "hard"], "meta": {"scene": "k1", "n": [1, 2]}}
    s = parse_record(obj, where="f.jsonl:3", index=0)
    assert s.tags == ("query:x", "hard")
    assert s.meta == {"scene": "k1", "n": [1, 2]}
    # The training format (what the byte guards compare) leaves them out; metadata=True not.
    assert s.to_record() == RECORD
    assert s.to_record(metadata=True) == obj
    assert training_format(obj) == RECORD


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tags": "hard"}, "field 'tags' must be a list of strings, got str"),
        ({"tags": ["a b"]}, "field 'tags[0]': tag 'a b' has a character"),
        ({"tags": ["x", "x"]}, "tag 'x' is given twice"),
        ({"tags": [1]}, "field 'tags[0]': a tag must be a string"),
        ({"meta": ["k"]}, "field 'meta' must be a JSON object, got list"),
        ({"meta": {"x": float("nan")}}, "field 'meta' must hold JSON data only"),
        ({"meta": {"x": "y" * MAX_META_BYTES}}, f"(at most {MAX_META_BYTES})"),
        ({"tag": ["x"]}, "unknown field(s) ['tag']"),
    ],
)
def test_malformed_tags_or_meta_are_refused_naming_file_line_and_scenario(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "bench.jsonl"
    lines = [json.dumps(RECORD), json.dumps({**RECORD, "id": "b", **change}, allow_nan=True)]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(BenchmarkError) as info:
        load_jsonl(path)
    assert str(info.value).startswith(f"{path}:2 (scenario 'b'): ")
    assert message in str(info.value)


def test_too_many_distinct_tags_is_refused_at_the_scenario_that_passes_the_limit() -> None:
    records = [{**RECORD, "id": f"s{i}", "tags": [f"t{i}"]} for i in range(MAX_DISTINCT_TAGS + 1)]
    from_records(records[:MAX_DISTINCT_TAGS], "b")
    with pytest.raises(BenchmarkError, match=f"record {MAX_DISTINCT_TAGS + 1}: .* more than"):
        from_records(records, "b")


def test_fingerprint_covers_tags_and_keeps_untagged_benchmarks_unchanged() -> None:
    plain = from_records([RECORD], "b")
    # The fingerprint before tags existed: the training-format lines only.
    expected = hashlib.sha256(dump_record(RECORD).encode("utf-8")).hexdigest()
    assert plain.fingerprint == "sha256:" + expected
    tagged = from_records([{**RECORD, "tags": ["x"]}], "b")
    other = from_records([{**RECORD, "tags": ["y"]}], "b")
    with_meta = from_records([{**RECORD, "meta": {}}], "b")
    assert (
        len({plain.fingerprint, tagged.fingerprint, other.fingerprint, with_meta.fingerprint}) == 4
    )
    assert tagged.tags == ["x"]


# -- the scene_memory builder ------------------------------------------------------------------


def _build(oracle: bool) -> list[dict[str, Any]]:
    options = {"builder": "scene_memory", "tasks": "demo/data/tasks_val.jsonl"}
    if oracle:
        options["init_state_manifest"] = "demo/data/init_state_manifest.jsonl"
    return list(scene_memory.build(options, REPO))


def test_builder_tags_the_demo_benchmark() -> None:
    baseline, oracle = _build(False), _build(True)
    counts = Counter(tag for r in oracle for tag in r["tags"])
    # Query kinds partition the scenarios (the generator's mix: 35% door, 35% recent, 30% any
    # object, of which 7 happened to pick the last-moved object); chain buckets too.
    assert {t: c for t, c in counts.items() if t.startswith("query:")} == {
        "query:door-state": 69,
        "query:recent-object": 76,
        "query:older-object": 44,
    }
    assert {t: c for t, c in counts.items() if t.startswith("chain:")} == {
        "chain:1-10": 33,
        "chain:11-20": 55,
        "chain:21-30": 51,
        "chain:31-40": 50,
    }
    assert counts["oracle:close-dropped"] == 155 and counts["oracle:open-inserted"] == 175
    # The baseline variant cannot know what the oracle variant changes: no oracle tags.
    for b, o in zip(baseline, oracle, strict=True):
        assert b["tags"] == [t for t in o["tags"] if not t.startswith("oracle:")]
        assert b["meta"] == {
            "scene_id": o["meta"]["scene_id"],
            "chain_length": len(b["memory_chain"]),
        }


def test_builder_oracle_tags_follow_the_turns_it_renders() -> None:
    for record in _build(True):
        turns = [m["content"] for m in record["messages"] if m["role"] == "assistant"][:-1]
        chain = record["memory_chain"]
        dropped = sum(s.startswith("close ") for s in chain) - sum(
            s.startswith("close ") for s in turns
        )
        inserted = sum(s.startswith("open ") for s in turns) - sum(
            s.startswith("open ") for s in chain
        )
        assert (record["meta"]["closes_dropped"], record["meta"]["opens_inserted"]) == (
            dropped,
            inserted,
        )
        assert ("oracle:close-dropped" in record["tags"]) == (dropped > 0)
        assert ("oracle:open-inserted" in record["tags"]) == (inserted > 0)
        low = (len(chain) - 1) // 10 * 10 + 1
        assert f"chain:{low}-{low + 9}" in record["tags"]


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("is fridge open ?", "door-state"),
        ("where is apple ?", "recent-object"),  # the object of the chain's last place
        ("where is mug ?", "older-object"),  # moved, but before the apple
        ("where is cup ?", "older-object"),  # never moved: the initial state
        ("how many mugs ?", "other"),
    ],
)
def test_builder_query_kind(query: str, kind: str) -> None:
    task = scene_memory.Task(
        id="s1",
        scene_id="k1",
        objects=(("mug", "counter"), ("apple", "sink"), ("cup", "table")),
        goals=(
            scene_memory.Goal("mug to fridge", ("pick mug from counter", "place mug in fridge")),
            scene_memory.Goal("apple to table", ("pick apple from sink", "place apple in table")),
            scene_memory.Goal("close fridge", ("close fridge",)),
        ),
        query=query,
        answer="x",
        where="t:1",
    )
    assert scene_memory.scenario_tags(task)[0] == f"query:{kind}"


def test_training_files_hold_no_evaluation_metadata() -> None:
    """The committed training-format files are the builder's records without tags and meta,
    byte for byte (so the byte guards and the adapters' training data are unchanged)."""
    for variant, oracle in (("baseline", False), ("oracle", True)):
        built = "".join(dump_record(training_format(r)) for r in _build(oracle))
        assert built == (DEMO / "data" / variant / "val.jsonl").read_text("utf-8")
