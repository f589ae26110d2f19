"""core/results.py: finalize_run writes a run, load_checked_run reads it back or refuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core import results
from pytest_memeval.core.recount import recount_file, recount_run
from pytest_memeval.core.results import (
    CheckedRun,
    FinalizeError,
    RunFacts,
    RunLoadError,
    finalize_run,
    load_checked_run,
)
from pytest_memeval.core.runlayout import new_subset_dir

from ..runfactory import make_record

FINGERPRINTS = {"benchmark": "sha256:b", "model": None, "adapter": None, "decoding": None}


def records() -> list[dict[str, Any]]:
    """Four scenarios: s1 wrong, s2 one turn wrong, s3 unaligned, odd ids kept verbatim."""
    return [
        make_record("s0", 0, final_match=True),
        make_record("s1/a b", 1, final_match=False),
        make_record("s2[ü]", 2, final_match=True, turn_matches=[True, False]),
        make_record("s3", 3, final_match=True, chain=["pick mug from counter"]),
    ]


def facts(n: int, **changes: Any) -> RunFacts:
    base: dict[str, Any] = {
        "ckpt": "demo",
        "kind": "replay",
        "complete": True,
        "scope": {"benchmark_total": n, "in_scope": n, "selected": n, "evaluated": n},
        "fingerprints": FINGERPRINTS,
        "decoding": {"path": "replay"},
        "benchmark": {"source": "bench.jsonl"},
        "wall_s": 2.0,
    }
    return RunFacts(**{**base, **changes})


def write(run_dir: Path, recs: list[dict[str, Any]] | None = None, **changes: Any) -> Path:
    """A finished run at the top of ``run_dir``, written by finalize_run; returns run_dir."""
    recs = records() if recs is None else recs
    stage = new_subset_dir(run_dir, 0.0)
    done = finalize_run(iter(recs), facts(len(recs), **changes), stage=stage, run_dir=run_dir)
    assert done.written == run_dir
    return run_dir


# -- finalize_run ---------------------------------------------------------------------------


def test_finalize_writes_counts_promotes_and_round_trips(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "demo"
    stage = new_subset_dir(run_dir, 0.0)
    done = finalize_run(iter(records()), facts(4), stage=stage, run_dir=run_dir)
    m = done.metrics
    assert (m["n"], m["m1"]["correct"], m["m1"]["total"]) == (4, 3, 4)
    # m2: aligned scenarios only (s3 is unaligned): s0 2/2, s1 2/2, s2 1/2.
    assert (m["m2"]["correct"], m["m2"]["total"], m["unaligned"]) == (5, 6, 1)
    assert m["complete"] is True and m["fingerprints"] == FINGERPRINTS
    assert m["timing"] == {"wall_s": 2.0, "scenarios_per_s": 2.0}  # no batched record
    assert m["overrides"] == {} and m["predictions_sha256"].startswith("sha256:")
    # Finished: promoted to the top level, and the stage (with subsets/) is gone.
    assert done.promoted and done.written == run_dir and done.kept_previous is None
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.json", "predictions.jsonl"]
    assert json.loads((run_dir / "metrics.json").read_text("utf-8")) == m
    recount_run(run_dir)

    run = load_checked_run(run_dir)
    assert isinstance(run, CheckedRun)
    assert run.metrics == m and run.ckpt == "demo"
    assert list(run.records) == ["s0", "s1/a b", "s2[ü]", "s3"]  # predictions' order
    assert list(run.records.values()) == records()


def test_finalize_of_an_unfinished_run_stays_beside_the_finished_one(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run")
    before = (run_dir / "metrics.json").read_bytes()
    stage = new_subset_dir(run_dir, 100.0)
    recs = records()[:2]
    done = finalize_run(
        iter(recs),
        facts(4, complete=False, missing=["s2[ü]", "s3"]),
        stage=stage,
        run_dir=run_dir,
    )
    assert not done.promoted and done.written == stage
    assert done.metrics["missing"] == ["s2[ü]", "s3"] and done.metrics["n"] == 2
    assert (stage / "metrics.json").is_file() and (stage / "predictions.jsonl").is_file()
    assert (run_dir / "metrics.json").read_bytes() == before  # the finished run is untouched
    recount_run(stage)  # an unfinished run recounts exactly too


def test_finalize_keeps_the_replaced_finished_run_in_previous(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run", ckpt="first")
    stage = new_subset_dir(run_dir, 100.0)
    done = finalize_run(iter(records()), facts(4, ckpt="second"), stage=stage, run_dir=run_dir)
    assert done.kept_previous == run_dir / "previous"
    assert json.loads((run_dir / "previous" / "metrics.json").read_text("utf-8"))["ckpt"] == (
        "first"
    )
    assert load_checked_run(run_dir).ckpt == "second"


def test_finalize_timing_and_extra_fields(tmp_path: Path) -> None:
    recs = records()
    for rec, (batch, size) in zip(recs, [(4, 4), (4, 4), (2, 4), (1, 4)], strict=True):
        rec.update(decode_batch=batch, decode_batch_size=size)
    overrides = {"adapter": {"value": "/a", "profile": "/b"}}
    stage = tmp_path / "run"
    done = finalize_run(
        iter(recs),
        facts(
            4,
            wall_s=8.0,
            timing={"shard_wall_s": [8.0, 5.0]},
            extra={"merged_from": [{"shard": "1/2"}]},
            overrides=overrides,
        ),
        stage=stage,
        run_dir=stage,  # writing in place: nothing to promote
    )
    assert not done.promoted
    assert done.metrics["timing"] == {
        "wall_s": 8.0,
        "scenarios_per_s": 0.5,
        "mean_batch": 2.75,
        "batch_size": 4,
        "shard_wall_s": [8.0, 5.0],
    }
    assert done.metrics["merged_from"] == [{"shard": "1/2"}]
    assert done.metrics["overrides"] == overrides
    assert facts(4, wall_s=None).wall_s is None
    zero = finalize_run(iter(recs), facts(4, wall_s=None), stage=tmp_path / "z", run_dir=stage)
    assert zero.metrics["timing"]["scenarios_per_s"] is None


def test_finalize_refuses_when_the_recount_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard against a counting bug: a recount that differs leaves no metrics, and no
    predictions either."""

    def off_by_one(path: Path) -> dict[str, Any]:
        counted = recount_file(path)
        counted["m1"]["correct"] += 1
        return counted

    monkeypatch.setattr(results, "recount_file", off_by_one)
    stage = tmp_path / "run" / "subsets" / "x"
    with pytest.raises(FinalizeError, match="recount disagrees with the aggregate: m1: ") as exc:
        finalize_run(iter(records()), facts(4), stage=stage, run_dir=tmp_path / "run")
    assert exc.value.disagreements and exc.value.disagreements[0].startswith("m1: metrics say")
    assert list(stage.iterdir()) == []


# -- load_checked_run: what it refuses, and how it says so --------------------------------------


def refused(path: Path, *, shard: bool = False) -> str:
    with pytest.raises(RunLoadError) as exc:
        load_checked_run(path, shard=shard)
    return str(exc.value)


def test_refuses_a_tampered_metrics_json(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run")
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    metrics["m1"]["correct"] += 1
    (run_dir / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    msg = refused(run_dir)
    assert msg.startswith(f"{run_dir}: fails the recount: ")
    assert "metrics.json" in msg and "m1: metrics say" in msg


def test_refuses_truncated_predictions(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run")
    predictions = run_dir / "predictions.jsonl"
    lines = predictions.read_text("utf-8").splitlines(keepends=True)
    # A torn last line: the file and the line are named.
    predictions.write_text("".join(lines[:3]) + lines[3][:40], "utf-8")
    assert refused(run_dir).startswith(f"{predictions}:4: malformed JSON (")
    # A whole record dropped: every line is well formed, the recount says what is missing.
    predictions.write_text("".join(lines[:3]), "utf-8")
    msg = refused(run_dir)
    assert "fails the recount" in msg and "n: metrics say 4, recount gives 3" in msg
    assert "predictions_sha256: predictions.jsonl is not the file" in msg


def test_refuses_an_edited_prediction_by_its_hash(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run")
    predictions = run_dir / "predictions.jsonl"
    text = predictions.read_text("utf-8")
    assert "look around" in text
    predictions.write_text(text.replace("look around", "look up"), "utf-8")
    assert "(edited after the run?)" in refused(run_dir)


def _broken(record: dict[str, Any], how: str) -> object:
    """A copy of a real record with one thing wrong (``how``)."""
    bad = json.loads(json.dumps(record))
    if how == "list":
        return [1, 2]
    if how == "no id":
        del bad["id"]
    elif how == "int id":
        bad["id"] = 7
    elif how == "no final_match":
        del bad["final_match"]
    elif how == "turns not a list":
        bad["turns"] = 3
    elif how == "string index":
        bad["turns"][0]["index"] = "0"
    elif how == "no match":
        del bad["turns"][0]["match"]
    return bad


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("list", "not a JSON object, got [1, 2]"),
        ("no id", "missing field 'id'"),
        ("int id", "field 'id' must be a string, got 7"),
        ("no final_match", "scenario 's0': missing field 'final_match'"),
        ("turns not a list", "scenario 's0': field 'turns' must be a list, got 3"),
        ("string index", "scenario 's0': field 'turns[0].index' must be an integer, got \"0\""),
        ("no match", "scenario 's0': missing field 'turns[0].match'"),
    ],
)
def test_refuses_a_malformed_record_naming_file_and_line(
    tmp_path: Path, how: str, message: str
) -> None:
    """Refused by the one validator (core/records/) with file:line before the recount,
    never a KeyError/TypeError from it."""
    run_dir = write(tmp_path / "run")
    predictions = run_dir / "predictions.jsonl"
    lines = predictions.read_text("utf-8").splitlines(keepends=True)
    bad = _broken(json.loads(lines[0]), how)
    predictions.write_text(lines[0] + json.dumps(bad) + "\n" + "".join(lines[1:]), "utf-8")
    assert refused(run_dir) == f"{predictions}:2: {message}"


def test_refuses_a_scenario_twice(tmp_path: Path) -> None:
    run_dir = write(tmp_path / "run")
    predictions = run_dir / "predictions.jsonl"
    first = predictions.read_text("utf-8").splitlines(keepends=True)[0]
    with predictions.open("a", encoding="utf-8") as fh:
        fh.write("\n" + first)
    assert refused(run_dir) == (
        f"{predictions}:6: scenario 's0': field 'id': the scenario appears twice (first on line 1)"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{damaged", "malformed JSON (Expecting property name enclosed in double quotes, line 1"),
        (b"[1, 2]", "not a JSON object (metrics.json is one object), got [1, 2]"),
        (b'{"scope": [1]}', "missing field 'n'"),
        (b"\xff\xfe{}", "not UTF-8 text"),
    ],
)
def test_refuses_a_malformed_metrics_json(tmp_path: Path, content: bytes, message: str) -> None:
    run_dir = write(tmp_path / "run")
    (run_dir / "metrics.json").write_bytes(content)
    assert refused(run_dir).startswith(f"{run_dir / 'metrics.json'}: {message}")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("scope", [1], "field 'scope' must be a JSON object, got [1]"),
        ("missing", "s1", "field 'missing' must be a list, got \"s1\""),
    ],
)
def test_refuses_metrics_with_a_field_of_the_wrong_type(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    run_dir = write(tmp_path / "run")
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    metrics[key] = value
    (run_dir / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    assert refused(run_dir) == f"{run_dir / 'metrics.json'}: {message}"


def test_refuses_what_is_not_a_finished_run(tmp_path: Path) -> None:
    assert refused(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'}: not a run directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refused(empty) == f"{empty}: no metrics.json: not a finished run"
    # An unfinished run journals in subsets/<time>/: the hint says so (and "shard" for merge).
    journal = new_subset_dir(empty, 0.0) / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("", "utf-8")
    assert refused(empty).endswith(
        "not a finished run (its journal exists: the run did not finish; rerun it with "
        "--memeval-resume)"
    )
    assert "the shard run did not finish" in refused(empty, shard=True)
    run_dir = write(tmp_path / "run")
    (run_dir / "predictions.jsonl").unlink()
    assert refused(run_dir) == (
        f"{run_dir / 'predictions.jsonl'}: missing (it belongs beside metrics.json)"
    )


def test_a_newer_unfinished_run_is_refused_only_for_a_shard(tmp_path: Path) -> None:
    """compare and the gate read the finished run at the top while another run is under way
    beside it; merge refuses a shard that is being re-run."""
    run_dir = write(tmp_path / "run")
    journal = new_subset_dir(run_dir, 4e9) / "journal.jsonl"  # started after the top run
    journal.parent.mkdir(parents=True)
    journal.write_text("", "utf-8")
    assert load_checked_run(run_dir).metrics["n"] == 4
    assert refused(run_dir, shard=True) == (
        f"{run_dir}: a newer unfinished run of this shard is in {journal.parent}; finish it "
        "(pytest --memeval-resume) or remove that directory before merging"
    )


def test_a_programming_error_is_not_an_unreadable_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only bad input is refused: a bug (here a KeyError in the recount) stays a bug."""
    run_dir = write(tmp_path / "run")

    def broken(path: Path, **_: object) -> dict[str, Any]:
        raise KeyError("bug")

    monkeypatch.setattr(results, "recount_run", broken)
    with pytest.raises(KeyError, match="bug"):
        load_checked_run(run_dir)
