"""Predictions from another harness: the old script harness's JSONL, replayed.

The old harness (the seed's ``--mode score_only`` flow) writes one line per scenario with
``id``, ``final_pred``, ``turns[].pred``, sometimes ``final_gt``, and no stop flags. A replay
profile over such a file must give a complete run whose metrics the independent recount
reproduces, say that cut-off outputs could not be detected, and refuse a file that does not
fit the benchmark once, at configure, naming file, line, scenario and field.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.decode.replay import ReplayError, load_replay_source
from pytest_memeval.tools.compare import compare_runs, load_run
from pytest_memeval.tools.merge import merge_shards

from ..conftest import MemevalProject, demo_records
from ..runfactory import make_record, write_run

#: Demo scenarios s0002 (aligned, 9 turns), s0003 (unaligned: 6 turns, 7 chain entries) and
#: s0004 (aligned, 12 turns), as the old harness wrote them, by hand. Against the memory
#: chains: s0002 gets turns 2, 3 and 4 wrong (6/9) and the final right; s0003's final answer
#: is right after normalisation (case, spaces) and its turns are not scored; s0004 has one
#: empty turn (a parse failure, 11/12) and a wrong final answer. So: m1 2/3, m2 17/21.
OLD_HARNESS = textwrap.dedent(
    """\
    {"id": "s0002", "final_pred": "counter", "final_gt": "counter", "turns": [{"pred": "pick tomato from counter"}, {"pred": "place tomato in oven"}, {"pred": "pick mug from oven"}, {"pred": "close oven"}, {"pred": "open drawer"}, {"pred": "place mug in drawer"}, {"pred": "close drawer"}, {"pred": "pick milk from shelf"}, {"pred": "place milk in counter"}]}
    {"id": "s0003", "final_pred": "Cabinet_Right ", "turns": [{"pred": "open cabinet_right"}, {"pred": "pick apple from microwave"}, {"pred": "close microwave"}, {"pred": "place apple in fridge"}, {"pred": "close fridge"}, {"pred": "open microwave"}]}
    {"id": "s0004", "turns": [{"pred": "pick knife from drawer"}, {"pred": "close drawer"}, {"pred": "place knife in sink"}, {"pred": "pick cheese from fridge"}, {"pred": "close fridge"}, {"pred": "place cheese in drawer"}, {"pred": ""}, {"pred": "pick egg from fridge"}, {"pred": "close fridge"}, {"pred": "place egg in sink"}, {"pred": "pick bowl from sink"}, {"pred": "place bowl in counter"}], "final_pred": "sink", "final_gt": "counter"}
    """  # noqa: E501
)
LINES = OLD_HARNESS.splitlines(keepends=True)
EXPECTED = {
    "n": 3,
    "m1": {"correct": 2, "total": 3, "rate": 2 / 3},
    "m2": {"correct": 17, "total": 21, "rate": 17 / 21},
    "unaligned": 1,
    "parse_fail": {"final": 0, "turns": 1},
    "stop_flags": "absent",
}


def _counts(metrics: dict[str, Any]) -> dict[str, Any]:
    """The count fields of EXPECTED (m1/m2 without the intervals that ride beside them)."""
    out = {k: metrics[k] for k in EXPECTED}
    for key in ("m1", "m2"):
        out[key] = {k: out[key][k] for k in ("correct", "total", "rate")}
    return out


def _scenarios() -> list[dict[str, Any]]:
    return demo_records("oracle", 4)[1:]  # s0002, s0003, s0004


def _project(project: MemevalProject, text: str = OLD_HARNESS) -> Path:
    """The benchmark in the project; the predictions on another disk (an absolute path)."""
    elsewhere = project.path / "results disk" / "old harness"
    elsewhere.mkdir(parents=True, exist_ok=True)
    predictions = elsewhere / "preds.jsonl"
    predictions.write_text(text, "utf-8")
    project.write(
        _scenarios(),
        profiles=f"""
        [tool.memeval.ckpt.legacy]
        kind = "replay"
        predictions = "{predictions.as_posix()}"
        benchmark = "bench.jsonl"
        """,
    )
    return predictions


def _memeval_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``memeval`` command, from this checkout (the console script may be another's)."""
    code = "import sys; from pytest_memeval.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_old_harness_predictions_replay_to_a_complete_recounted_run(
    memeval_project: MemevalProject, xdist: list[str]
) -> None:
    _project(memeval_project)
    result = memeval_project.run("--ckpt", "legacy", *xdist)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out + result.stderr.str()
    # Wrong answers fail their items; nothing errors (no item-level tracebacks).
    assert result.parseoutcomes() == {"passed": 2, "failed": 3, "xfailed": 1}, out
    assert "Traceback" not in out
    result.stdout.fnmatch_lines(
        [
            "ckpt legacy: 3 scenarios (complete)",
            "m1 final-query: 2/3 = 66.67%",
            "m2 turn-level:  17/21 = 80.95%*",
            "stop flags: absent in the replayed predictions: cut-off outputs could not be "
            "detected*",
        ]
    )
    metrics = memeval_project.metrics("legacy")
    assert metrics["complete"] is True and metrics["kind"] == "replay"
    assert _counts(metrics) == EXPECTED
    # The independent recount (function and command) reproduces every count, stop_flags too.
    run_dir = memeval_project.run_dir("legacy")
    recounted = recount_run(run_dir)
    assert _counts(recounted) == EXPECTED
    cli = _memeval_cli("recount", str(run_dir))
    assert cli.returncode == 0, cli.stderr
    assert "m1=2/3 m2=17/21 unaligned=1" in cli.stdout
    # The records say what is known: no stop flag (null), nothing generated.
    records = memeval_project.predictions("legacy")
    assert [r["id"] for r in records] == ["s0002", "s0003", "s0004"]
    assert all(r["final_stopped"] is None and r["decode"] == "replay" for r in records)
    turns = [t for r in records for t in r["turns"]]
    assert all(t["stopped"] is None and t["generated"] is False for t in turns)
    assert records[2]["turns"][6]["parse_fail"] is True
    assert records[2]["final_gt"] == "counter" and records[1]["final_gt"] == "cabinet_right"


@pytest.mark.slow
def test_a_replayed_flagless_run_replays_compares_and_merges(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    predictions = _project(memeval_project)
    # The same outputs with the stop flags a model run records.
    flagged = memeval_project.path / "flagged.jsonl"
    lines = []
    for line in LINES:
        rec = json.loads(line)
        rec["final_stopped"] = True
        for turn in rec["turns"]:
            turn["stopped"] = True
        lines.append(json.dumps(rec) + "\n")
    flagged.write_text("".join(lines), "utf-8")
    memeval_project.write(
        _scenarios(),
        profiles=f"""
        [tool.memeval.ckpt.legacy]
        kind = "replay"
        predictions = "{predictions.as_posix()}"
        benchmark = "bench.jsonl"

        [tool.memeval.ckpt.flagged]
        kind = "replay"
        predictions = "flagged.jsonl"
        benchmark = "bench.jsonl"

        [tool.memeval.ckpt.again]
        kind = "replay"
        predictions = "runs/legacy/predictions.jsonl"
        benchmark = "bench.jsonl"
        """,
    )
    # Subprocesses: runs that execute eval items do not repeat safely in one process.
    for ckpt in ("legacy", "flagged"):
        assert memeval_project.run("--ckpt", ckpt).ret == 1
    assert memeval_project.metrics("flagged")["stop_flags"] == "present"
    # A run replayed from a flagless file (null flags) replays again, still flagless.
    again = memeval_project.run("--ckpt", "again")
    assert again.ret == 1, again.stdout.str() + again.stderr.str()
    assert _counts(memeval_project.metrics("again")) == EXPECTED

    comparison = compare_runs(
        load_run(memeval_project.run_dir("flagged")), load_run(memeval_project.run_dir("legacy"))
    )
    assert comparison["mcnemar"]["discordant"] == 0
    flagless_notes = [n for n in comparison["notes"] if "without stop flags" in n]
    assert len(flagless_notes) == 1 and flagless_notes[0].startswith("legacy ")

    shards = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        run = memeval_project.run(
            "--ckpt", "legacy", "--memeval-shard", f"{k}/2", "--memeval-out", str(out)
        )
        assert run.ret == 1
        shards.append(out)
    merged = merge_shards(shards, tmp_path / "merged")
    assert _counts(merged) == EXPECTED
    assert recount_run(tmp_path / "merged")["stop_flags"] == "absent"


def _drop(line: int, key: str) -> str:
    rec = json.loads(LINES[line])
    del rec[key]
    return "".join(json.dumps(rec) + "\n" if i == line else t for i, t in enumerate(LINES))


def _edit(line: int, **changes: Any) -> str:
    rec = {**json.loads(LINES[line]), **changes}
    return "".join(json.dumps(rec) + "\n" if i == line else t for i, t in enumerate(LINES))


_TURNS_4 = json.loads(LINES[2])["turns"]

#: Each bad file and the one problem its refusal must name: (file text, line, scenario, what).
REFUSALS: dict[str, tuple[str, int | None, str, str]] = {
    "missing-final-pred": (_drop(1, "final_pred"), 2, "s0003", "missing field 'final_pred'"),
    "missing-turns": (_drop(0, "turns"), 1, "s0002", "missing field 'turns'"),
    "missing-turn-pred": (
        _edit(2, turns=[{"text": "x"}, *_TURNS_4[1:]]),
        3,
        "s0004",
        "missing field 'turns[0].pred'",
    ),
    "too-few-turns": (
        _edit(2, turns=_TURNS_4[:-1]),
        3,
        "s0004",
        "field 'turns' has 11 turn prediction(s), but the scenario has 12 assistant turn(s)",
    ),
    "final-answer-among-turns": (
        _edit(2, turns=[*_TURNS_4, {"pred": "sink"}]),
        3,
        "s0004",
        "field 'turns' has 13 turn prediction(s), but the scenario has 12 assistant turn(s) "
        "before the final answer (does 'turns' include the final answer?",
    ),
    "malformed-line": (LINES[0] + '{"id": "s0003", "final_pred": \n' + LINES[2], 2, "", ""),
    "missing-id": (_drop(1, "id"), 2, "", "missing field 'id'"),
    "duplicate-id": (
        OLD_HARNESS + LINES[0],
        4,
        "s0002",
        "field 'id': the scenario appears twice (first on line 1)",
    ),
    "unknown-id": (OLD_HARNESS + _edit(0, id="s9999").splitlines(True)[0], 4, "s9999", ""),
    "scenario-without-line": (LINES[0] + LINES[2], None, "s0003", "no line for 1 scenario(s)"),
    "mixed-stop-flags": (
        _edit(1, final_stopped=True, turns=[{"pred": "x", "stopped": True}] * 6),
        2,
        "s0003",
        "field 'final_stopped': this line has stop flags, line 1 (scenario 's0002') does "
        "the opposite",
    ),
    "stop-flags-on-some-outputs": (
        _edit(1, final_stopped=True),
        2,
        "s0003",
        "field 'turns[0].stopped' is missing while 'final_stopped' is given",
    ),
    "stop-flag-not-boolean": (
        _edit(1, final_stopped="yes"),
        2,
        "s0003",
        "field 'final_stopped' must be true, false or absent",
    ),
}


def _expected_message(predictions: Path, case: str) -> str:
    _, line, sid, what = REFUSALS[case]
    where = f"{predictions}:{line}" if line is not None else f"{predictions}"
    if case == "malformed-line":
        return f"{where}: malformed JSON"
    if case == "unknown-id":
        return f"{where}: scenario 's9999': field 'id': no such scenario in "
    if case == "scenario-without-line":
        return f"{where}: {what} of the benchmark ("
    if not sid:
        return f"{where}: {what}"
    return f"{where}: scenario {sid!r}: {what}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REFUSALS), ids=list(REFUSALS))
def test_a_file_that_does_not_fit_is_refused_once_at_configure(
    memeval_project: MemevalProject, case: str
) -> None:
    predictions = _project(memeval_project, REFUSALS[case][0])
    result = memeval_project.pytester.runpytest("--ckpt", "legacy")
    _assert_refused(memeval_project, result, _expected_message(predictions, case))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["too-few-turns", "missing-final-pred"])
def test_refused_once_under_xdist_too(memeval_project: MemevalProject, case: str) -> None:
    predictions = _project(memeval_project, REFUSALS[case][0])
    result = memeval_project.run("-n", "2", "--ckpt", "legacy")
    _assert_refused(memeval_project, result, _expected_message(predictions, case))


def _assert_refused(project: MemevalProject, result: pytest.RunResult, message: str) -> None:
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out + err
    assert err.count(message) == 1, err
    assert err.count("ERROR: ") == 1, err  # one message
    assert "cannot replay" in err and "1 problem(s)" in err, err
    assert "Traceback" not in out + err
    assert "test_final_query" not in out + err  # no item ran
    assert not (project.path / "runs").exists(), "a refused run writes nothing"


def test_load_replay_source_checks_every_line_and_counts_the_problems(tmp_path: Path) -> None:
    """Unit level: the checks without pytest around them; every bad line is counted."""
    bench = from_records(_scenarios(), "bench")
    path = tmp_path / "preds.jsonl"
    path.write_text(OLD_HARNESS, "utf-8")
    source = load_replay_source(path, bench, bench.ids)
    assert source.stop_flags == "absent"
    assert source.predictions["s0003"].texts[-1] == "Cabinet_Right "
    assert source.predictions["s0002"].stopped is None
    assert [p.line for p in source.predictions.values()] == [1, 2, 3]
    # A shard's scope needs only its own scenarios.
    path.write_text(LINES[0], "utf-8")
    assert list(load_replay_source(path, bench, ["s0002"]).predictions) == ["s0002"]
    # Every line lacking final_pred is a problem; one message lists them with their lines.
    path.write_text(
        "".join(json.dumps({**json.loads(t), "final_pred": None}) + "\n" for t in LINES), "utf-8"
    )
    with pytest.raises(ReplayError) as info:
        load_replay_source(path, bench, bench.ids)
    text = str(info.value)
    assert text.startswith(f"cannot replay {path}: 3 problem(s):"), text
    for line, sid in enumerate(["s0002", "s0003", "s0004"], start=1):
        assert f"{path}:{line}: scenario {sid!r}: field 'final_pred' must be a string" in text


def test_recount_checks_stop_flags_and_reads_older_metrics(tmp_path: Path) -> None:
    records = [make_record(f"s{i}", i, final_match=True) for i in range(3)]
    run = write_run(tmp_path / "run", records, ckpt="old")
    metrics_path = run / "metrics.json"
    metrics = json.loads(metrics_path.read_text("utf-8"))
    assert metrics["stop_flags"] == "present"
    # Metrics written before the field existed: every run then had stop flags.
    del metrics["stop_flags"]
    metrics_path.write_text(json.dumps(metrics), "utf-8")
    assert recount_run(run)["stop_flags"] == "present"
    # A claim the records do not bear out is a recount failure naming the field.
    metrics_path.write_text(json.dumps({**metrics, "stop_flags": "absent"}), "utf-8")
    with pytest.raises(RecountError, match="stop_flags: metrics say 'absent', recount gives"):
        recount_run(run)
    # Records without flags (null, as a flagless replay writes them): absent, or mixed.
    for rec in records:
        rec["final_stopped"] = None
        for turn in rec["turns"]:
            turn["stopped"] = None
    assert recount_run(write_run(tmp_path / "absent", records, ckpt="a"))["stop_flags"] == "absent"
    records[0]["final_stopped"] = True
    assert recount_run(write_run(tmp_path / "mixed", records, ckpt="m"))["stop_flags"] == "mixed"
