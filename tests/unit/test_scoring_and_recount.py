"""Scoring a rollout into a record, aggregating records, and the independent recount."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import parse_record
from pytest_memeval.core.matching import ParseRules
from pytest_memeval.core.metrics import Tally
from pytest_memeval.core.records import Rollout, TurnOutput
from pytest_memeval.core.recount import RecountError, recount_file, recount_run
from pytest_memeval.core.rundir import write_json
from pytest_memeval.core.scoring import score

from ..runfactory import conv


def rollout(*texts: str, stopped: bool = True) -> Rollout:
    return Rollout(tuple(TurnOutput(t, stopped) for t in texts), "test")


ALIGNED = parse_record(
    {
        "id": "al",
        "messages": conv("pick mug", "place mug"),
        "memory_chain": ["pick mug", "place mug"],
    },
    where="x",
    index=0,
)
# Door-grounded: three turns against a two-entry canonical chain.
UNALIGNED = parse_record(
    {
        "id": "un",
        "messages": conv("open fridge", "pick mug", "place mug"),
        "memory_chain": ["pick mug", "place mug"],
    },
    where="x",
    index=1,
)


def _count_keys(block: dict[str, object]) -> dict[str, object]:
    return {k: block[k] for k in ("correct", "total", "rate")}


def test_m1_is_scored_whatever_the_turn_structure() -> None:
    """The seed's defect-12: an unaligned structure must not stop m1 from being scored."""
    rec = score(UNALIGNED, rollout("open fridge", "pick mug", "place mug", "fridge"), ParseRules())
    assert rec["aligned"] is False and rec["final_match"] is True
    assert [t["granularity"] for t in rec["turns"]] == ["unaligned"] * 3
    assert all(t["gt"] is None and t["match"] is None for t in rec["turns"])
    assert [t["pred"] for t in rec["turns"]] == ["open fridge", "pick mug", "place mug"]
    tally = Tally().extend([rec])
    assert _count_keys(tally.counts()["m1"]) == {"correct": 1, "total": 1, "rate": 1.0}
    assert _count_keys(tally.counts()["m2"]) == {"correct": 0, "total": 0, "rate": None}
    assert tally.counts()["m2"]["ci95"] is None and tally.counts()["m2"]["clusters"] == 0


def test_aligned_turns_count_for_m2() -> None:
    rec = score(ALIGNED, rollout("Pick mug ", "place cup", "sink"), ParseRules())
    assert [t["match"] for t in rec["turns"]] == [True, False]
    assert rec["final_match"] is False and rec["final_gt"] == "fridge"
    counts = Tally().extend([rec]).counts()
    assert _count_keys(counts["m2"]) == {"correct": 1, "total": 2, "rate": 0.5}
    # One scenario: no clustering possible, Wilson over its turns (and said so).
    assert counts["m2"]["clusters"] == 1 and counts["m2"]["ci95_method"].startswith("wilson")
    assert counts["unaligned"] == 0


def test_parse_failures_are_counted_apart_from_wrong_answers() -> None:
    rec = score(
        ALIGNED,
        Rollout(
            (TurnOutput("pick mug", True), TurnOutput("", True), TurnOutput("frid", False)), "t"
        ),
        ParseRules(),
    )
    assert rec["parse_fail"] is True and rec["final_match"] is False
    assert "max_new_tokens" in rec["parse_fail_reason"]
    counts = Tally().extend([rec]).counts()
    assert counts["parse_fail"] == {"final": 1, "turns": 1}


def test_wrong_number_of_outputs_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 outputs for 3 assistant messages"):
        score(ALIGNED, rollout("a", "b"), ParseRules())


def _run(tmp_path: Path) -> Path:
    records = [
        score(ALIGNED, rollout("pick mug", "place mug", "fridge"), ParseRules()),
        score(UNALIGNED, rollout("open fridge", "x", "place mug", "sink"), ParseRules()),
    ]
    (tmp_path / "predictions.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), "utf-8"
    )
    write_json(tmp_path / "metrics.json", Tally().extend(records).counts())
    return tmp_path


def test_recount_agrees_with_the_aggregate(tmp_path: Path) -> None:
    run = _run(tmp_path)
    recounted = recount_run(run)
    assert _count_keys(recounted["m1"]) == {"correct": 1, "total": 2, "rate": 0.5}
    assert _count_keys(recounted["m2"]) == {"correct": 2, "total": 2, "rate": 1.0}
    assert recounted["unaligned"] == 1


def test_recount_catches_a_doctored_metric_and_a_doctored_prediction(tmp_path: Path) -> None:
    run = _run(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["m1"]["correct"] = 2
    write_json(run / "metrics.json", metrics)
    with pytest.raises(RecountError, match=r"m1: metrics say .*'correct': 2"):
        recount_run(run)
    metrics["m1"]["correct"] = 1
    write_json(run / "metrics.json", metrics)
    recount_run(run)
    lines = (run / "predictions.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["turns"][1]["match"] = False
    (run / "predictions.jsonl").write_text("\n".join([json.dumps(first), lines[1]]) + "\n")
    with pytest.raises(RecountError, match="m2"):
        recount_run(run)


def test_recount_refuses_duplicates(tmp_path: Path) -> None:
    run = _run(tmp_path)
    line = (run / "predictions.jsonl").read_text().splitlines()[0]
    (run / "predictions.jsonl").write_text(f"{line}\n{line}\n")
    with pytest.raises(RecountError, match="appears twice"):
        recount_file(run / "predictions.jsonl")


def test_recount_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_memeval.tools.cli import main

    run = _run(tmp_path)
    assert main(["recount", str(run)]) == 0
    assert "memeval recount: OK" in capsys.readouterr().out
    (run / "metrics.json").write_text('{"n": 5}')
    assert main(["recount", str(run)]) == 1
    assert "FAIL" in capsys.readouterr().err


def test_recount_checks_what_readers_rely_on(tmp_path: Path) -> None:
    """The hash, the per-position m2 and the completeness claim are checked too."""
    from pytest_memeval.core.rundir import sha256_file

    run = _run(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    good = {
        **metrics,
        "predictions_sha256": sha256_file(run / "predictions.jsonl"),
        "m2_by_position": {"0": {"correct": 1, "total": 1}, "1": {"correct": 1, "total": 1}},
        "complete": True,
        "missing": [],
        "not_selected": [],
        "scope": {"in_scope": 2, "shard": None},
    }
    write_json(run / "metrics.json", good)
    recount_run(run)
    for change, needle in [
        ({"predictions_sha256": "sha256:00"}, "edited after the run"),
        ({"m2_by_position": {"0": {"correct": 2, "total": 2}}}, "m2_by_position"),
        ({"missing": ["x"]}, "listed as missing"),
        ({"scope": {"in_scope": 3, "shard": None}}, "2 records for 3 scenarios"),
        ({"scope": {"in_scope": 2, "shard": {"spec": "1/2"}}}, "for a shard run"),
    ]:
        write_json(run / "metrics.json", {**good, **change})
        with pytest.raises(RecountError, match=needle):
            recount_run(run)
