"""Messages that list or quote data cut it the one way (core.formatting): at most
``SHOWN`` entries and "and N more", values shortened with one ``…`` (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.core.formatting import ELLIPSIS, SHOWN
from pytest_memeval.core.records import RecordError, validate_record
from pytest_memeval.decode.replay import ReplayError, load_replay_source
from pytest_memeval.runtime.assertions import WrongAnswer, check_final_query, check_turns
from pytest_memeval.runtime.resume import header_differences

from ..conftest import demo_records
from ..runfactory import make_record


def test_wrong_turns_list_the_first_shown_and_count_the_rest() -> None:
    n = SHOWN + 3
    record = make_record(
        "s1",
        0,
        final_match=True,
        targets=[f"pick item{i} from counter" for i in range(n)],
        turn_matches=[False] * n,
    )
    with pytest.raises(WrongAnswer) as info:
        check_turns(record)  # type: ignore[arg-type]
    lines = str(info.value).splitlines()
    assert lines[0] == f"scenario s1: {n}/{n} turns wrong"
    assert lines[1] == "  turn 0: expected 'pick item0 from counter', predicted 'look around'"
    assert (
        lines[SHOWN] == f"  turn {SHOWN - 1}: expected 'pick item{SHOWN - 1} from counter', "
        "predicted 'look around'"
    )
    assert lines[SHOWN + 1 :] == ["  and 3 more"]


def test_one_line_summary_shortens_long_answers() -> None:
    long_pred = "sink " * 40
    record = make_record("s1", 0, final_match=False, final_pred=long_pred)
    with pytest.raises(WrongAnswer) as info:
        check_final_query(record)  # type: ignore[arg-type]
    compact = info.value.compact
    assert f"predicted {repr(long_pred)[:79]}{ELLIPSIS}" in compact
    assert repr(long_pred) in str(info.value)  # the full message keeps it all


def test_replay_refusal_lists_the_first_shown_problems(tmp_path: Path) -> None:
    scenarios = demo_records("oracle", SHOWN + 2)
    bench = from_records(scenarios, "bench")
    path = tmp_path / "preds.jsonl"
    # Every line lacks final_pred: one problem per line, 12 in all.
    path.write_text("".join(json.dumps({"id": s["id"]}) + "\n" for s in scenarios), "utf-8")
    with pytest.raises(ReplayError) as info:
        load_replay_source(path, bench, bench.ids)
    lines = str(info.value).splitlines()
    assert lines[0] == f"cannot replay {path}: {SHOWN + 2} problem(s):", lines
    assert all(line.startswith(f"  {path}:{i}: ") for i, line in enumerate(lines[1:-1], 1))
    assert len(lines) == SHOWN + 2 and lines[-1] == "  and 2 more", lines


def test_resume_header_differences_shorten_values() -> None:
    old = {"fingerprints": {"model": "sha256:" + "a" * 64}}
    new = {"fingerprints": {"model": "sha256:" + "b" * 64}}
    (diff,) = header_differences(old, new)
    assert diff == (
        f"model fingerprint: journal {repr(old['fingerprints']['model'])[:39]}{ELLIPSIS}, "
        f"now {repr(new['fingerprints']['model'])[:39]}{ELLIPSIS}"
    )


def test_record_errors_shorten_the_value() -> None:
    with pytest.raises(RecordError) as info:
        validate_record({"id": list(range(100))}, "preds.jsonl:3")
    text = str(info.value)
    assert f"got {json.dumps(list(range(100)))[:59]}{ELLIPSIS}" in text, text
