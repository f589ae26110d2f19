"""The benchmark format: validation, alignment, canonical serialisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import (
    BenchmarkError,
    dump_record,
    from_records,
    load_jsonl,
    parse_record,
)

from ..runfactory import conv


def test_aligned_scenario_scores_turns_against_memory_chain() -> None:
    s = parse_record(
        {
            "id": "a",
            "messages": conv("pick mug", "place mug"),
            "memory_chain": ["PICK mug", "place mug"],
        },
        where="x",
        index=0,
    )
    assert s.aligned and s.granularity == "memory_chain"
    assert [s.turn_gt(0), s.turn_gt(1)] == ["PICK mug", "place mug"]
    assert s.final_gt == "fridge" and s.final_index == len(s.messages) - 1
    assert s.turn_indices == (2, 4)


def test_unaligned_scenario_has_no_turn_truth() -> None:
    s = parse_record(
        {
            "id": "u",
            "messages": conv("open fridge", "pick mug", "place mug"),
            "memory_chain": ["pick mug", "place mug"],
        },
        where="x",
        index=0,
    )
    assert not s.aligned and s.granularity == "unaligned"
    assert s.turn_gt(0) is None and s.turn_gt(2) is None


def test_without_memory_chain_the_messages_are_the_truth() -> None:
    s = parse_record({"id": "m", "messages": conv("pick mug")}, where="x", index=0)
    assert s.aligned and s.granularity == "message" and s.turn_gt(0) == "pick mug"


def test_scenario_with_only_a_final_answer_has_no_turns() -> None:
    s = parse_record({"id": "f", "messages": conv()}, where="x", index=0)
    assert s.turn_indices == () and s.aligned


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        ([1, 2], "must be a JSON object"),
        ({"messages": conv("a")}, "'id' is missing"),
        ({"id": "x", "messages": []}, "'messages' is missing or not a non-empty list"),
        ({"id": "x", "messages": [{"role": "robot", "content": "hi"}]}, "unknown role 'robot'"),
        (
            {"id": "x", "messages": [{"role": "user", "content": 3}]},
            "content is missing or not a string",
        ),
        ({"id": "x", "messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
        (
            {"id": "x", "messages": [*conv("a"), {"role": "user", "content": "q"}]},
            "ends on a 'user' message",
        ),
        (
            {"id": "x", "messages": conv("a"), "memory_chain": "a"},
            "'memory_chain' must be a list of strings",
        ),
        ({"id": "x", "messages": conv("a"), "extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_malformed_records_name_where_and_what(obj: object, needle: str) -> None:
    with pytest.raises(BenchmarkError) as info:
        parse_record(obj, where="bench.jsonl:7", index=0)
    assert str(info.value).startswith("bench.jsonl:7")
    assert needle in str(info.value)


def test_load_jsonl_reports_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"id": "a", "messages": conv("x")})
    path = tmp_path / "b.jsonl"
    path.write_text(good + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(BenchmarkError, match=r"b\.jsonl:3: malformed JSON"):
        load_jsonl(path)


def test_duplicate_ids_and_empty_files_are_refused(tmp_path: Path) -> None:
    rec = json.dumps({"id": "a", "messages": conv("x")})
    dup = tmp_path / "dup.jsonl"
    dup.write_text(f"{rec}\n{rec}\n", encoding="utf-8")
    with pytest.raises(
        BenchmarkError,
        match=r"dup\.jsonl:2.*duplicate scenario id 'a' \(first seen at .*dup\.jsonl:1\)",
    ):
        load_jsonl(dup)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(BenchmarkError, match="has no scenarios"):
        load_jsonl(empty)


def test_encoding_problems_are_named(tmp_path: Path) -> None:
    rec = json.dumps({"id": "a", "messages": conv("x")}).encode()
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + rec + b"\n")
    with pytest.raises(BenchmarkError, match=r"bom\.jsonl:1: .*byte-order mark"):
        load_jsonl(bom)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(rec + b"\n" + rec.replace(b'"a"', b'"\xe9"') + b"\n")
    with pytest.raises(BenchmarkError, match=r"latin\.jsonl:2: not valid UTF-8"):
        load_jsonl(latin)
    with pytest.raises(BenchmarkError, match="not found"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_fingerprint_follows_content_and_order() -> None:
    a = {"id": "a", "messages": conv("x")}
    b = {"id": "b", "messages": conv("y")}
    one = from_records([a, b], "t")
    assert one.ids == ["a", "b"]
    assert from_records([a, b], "t").fingerprint == one.fingerprint
    assert from_records([b, a], "t").fingerprint != one.fingerprint
    changed = {"id": "b", "messages": conv("y", final="sink")}
    assert from_records([a, changed], "t").fingerprint != one.fingerprint


def test_dump_record_is_the_training_serialisation() -> None:
    record = {"id": "é", "messages": conv("x")}
    line = dump_record(record)
    assert line.endswith("\n") and "é" in line
    assert json.loads(line) == record
    s = parse_record(record, where="x", index=0)
    assert dump_record(s.to_record()) == line
