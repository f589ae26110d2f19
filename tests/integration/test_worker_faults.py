"""A worker that dies or stops at any moment never hangs a run, under real xdist.

Each case is a pytester run of the demo checkpoint over six scenarios with a real fault (a
worker killed by SIGKILL from inside itself, or stopped by SIGSTOP), at one moment of the
run: while it collects, in the first chunk, in the middle, in the last chunk, while it
measures the fast path's calibration holding the store's lock, after its last item, and two
workers and a replacement killed in one run. Every run has a bounded wall time (a hang fails
the test, it does not stall the suite), and ends either complete, with the same predictions
and counts as an uninterrupted run, or in the documented unfinished state, which
``--memeval-resume`` completes to that same result. No run leaves the run directory's lock.
The scheduler's own sweep over every moment, without processes, is
``tests/unit/test_scheduler_faults.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.recount import recount_run

from ..conftest import MemevalProject, demo_records, write_project
from ..faults import WORKER_FAULTS_CONFTEST
from ..moduleruns import run_pytest
from ..runfactory import COUNT_FIELDS, content, read_jsonl

pytestmark = pytest.mark.slow

N = 6
IDS = [r["id"] for r in demo_records("oracle", N)]
#: A run that takes longer than this is a hang (an uninterrupted run takes seconds).
WALL_S = 240


def clean(root: Path, *args: str) -> dict[str, Any]:
    """An uninterrupted run of the same project without xdist, to compare with."""
    write_project(root, demo_records("oracle", N))
    proc = run_pytest(root, "--ckpt", "demo", "-q", "-p", "no:xdist", *args, timeout=WALL_S)
    assert proc.ret in (0, 1), proc.stdout.str() + proc.stderr.str()
    run_dir = next((root / "runs").iterdir())
    return {
        "metrics": json.loads((run_dir / "metrics.json").read_text("utf-8")),
        "predictions": read_jsonl(run_dir / "predictions.jsonl"),
    }


@pytest.fixture(scope="module")
def clean_truth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return clean(tmp_path_factory.mktemp("clean-truth"))


@pytest.fixture(scope="module")
def clean_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return clean(tmp_path_factory.mktemp("clean-model"), "--memeval-history", "model")


@pytest.fixture
def faulty(memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch) -> MemevalProject:
    memeval_project.write(demo_records("oracle", N))
    memeval_project.pytester.makeconftest(WORKER_FAULTS_CONFTEST)
    flags = memeval_project.path / "flags"
    flags.mkdir()
    monkeypatch.setenv("WORKER_FAULT_FLAGS", str(flags))
    return memeval_project


def run_dir_of(project: MemevalProject) -> Path:
    return next((project.path / "runs").iterdir())


def assert_unlocked(project: MemevalProject) -> None:
    runs = project.path / "runs"
    locks = sorted(runs.rglob("memeval.lock")) if runs.is_dir() else []
    assert locks == [], f"a lock was left behind: {locks}"


def outputs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the model produced and how it scored: the records less where and how they ran
    (placement; the decode path, and each turn's ``generated``, all true on the reference
    path)."""
    return [
        {
            **{k: v for k, v in r.items() if k != "decode"},
            "turns": [{k: v for k, v in t.items() if k != "generated"} for t in r["turns"]],
        }
        for r in content(records)
    ]


def assert_same_as(project: MemevalProject, expected: dict[str, Any]) -> None:
    run_dir = run_dir_of(project)
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    assert metrics["complete"] is True and metrics["missing"] == []
    # generated_turns counts the turns the decoder generated: all of them on the reference
    # path, only the pending ones on the fast path. Everything else must be equal.
    for key in COUNT_FIELDS:
        if key in expected["metrics"] and key != "generated_turns":
            assert metrics[key] == expected["metrics"][key], key
    assert outputs(read_jsonl(run_dir / "predictions.jsonl")) == outputs(expected["predictions"])
    recount_run(run_dir)


def finish(project: MemevalProject, result: pytest.RunResult, *args: str) -> None:
    """Whatever state the faulty run ended in, it is the documented one: complete, or
    unfinished and completed by ``--memeval-resume``."""
    out = result.stdout.str()
    assert result.ret != 0, out  # a crash is never a silent success
    assert_unlocked(project)
    metrics_file = run_dir_of(project) / "metrics.json"
    if metrics_file.is_file():
        return  # finished within the run
    assert "--memeval-resume" in out, out
    resumed = project.run("--ckpt", "demo", "-n", "2", "--memeval-resume", *args, timeout=WALL_S)
    assert resumed.ret in (0, 1), resumed.stdout.str()
    assert_unlocked(project)


@pytest.mark.parametrize(
    ("moment", "args"),
    [
        pytest.param(f"scenario:{IDS[0]}", ("-n", "2"), id="first-chunk-fast"),
        pytest.param(
            f"scenario:{IDS[N // 2]}",
            ("-n", "2", "--memeval-decode", "reference"),
            id="middle-reference",
        ),
        pytest.param(f"scenario:{IDS[-1]}", ("-n", "3"), id="last-chunk-fast-3-workers"),
        pytest.param("finish", ("-n", "2", "--memeval-decode", "reference"), id="after-last-item"),
    ],
)
def test_a_worker_killed_at_any_moment_finishes_as_an_uninterrupted_run(
    faulty: MemevalProject,
    clean_truth: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
    args: tuple[str, ...],
) -> None:
    monkeypatch.setenv("WORKER_FAULT", moment)
    result = faulty.run("--ckpt", "demo", *args, timeout=WALL_S)
    out = result.stdout.str()
    if moment.startswith("scenario:"):
        sid = moment.split(":", 1)[1]
        # The crashed worker and scenario, named once; the scenario's other item ran on
        # another worker and gave its record, so the run finished within itself.
        assert f"crashed while running 'test_eval.py::test_final_query[{sid}]'" in out, out
        assert (run_dir_of(faulty) / "metrics.json").is_file(), out
    finish(faulty, result)
    assert_same_as(faulty, clean_truth)


def test_a_worker_killed_while_it_collects_stops_the_run_and_a_rerun_completes(
    faulty: MemevalProject, clean_truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_FAULT", "collect")
    result = faulty.run("--ckpt", "demo", "-n", "2", timeout=WALL_S)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*worker gw0 failed to start*"])
    assert_unlocked(faulty)
    monkeypatch.delenv("WORKER_FAULT")
    again = faulty.run("--ckpt", "demo", "-n", "2", timeout=WALL_S)
    assert again.ret in (0, 1), again.stdout.str()
    assert_same_as(faulty, clean_truth)


def test_a_worker_killed_while_it_measures_the_calibration(
    faulty: MemevalProject, clean_truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache directory of its own: the calibration is measured, under the store's lock,
    # by whichever worker gets there first, and that worker dies holding the lock. The
    # other one takes the lock over (the kernel releases it with the process) and measures.
    monkeypatch.setenv("WORKER_FAULT", "calibration")
    cache = faulty.path / "cache"
    result = faulty.run("--ckpt", "demo", "-n", "2", "--memeval-cache-dir", str(cache))
    assert (faulty.path / "flags" / "fault-calibration").exists(), "the fault never fired"
    finish(faulty, result, "--memeval-cache-dir", str(cache))
    assert_same_as(faulty, clean_truth)


def test_a_worker_killed_in_a_free_running_run(
    faulty: MemevalProject, clean_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_FAULT", f"scenario:{IDS[2]}")
    args = ("--memeval-history", "model")
    result = faulty.run("--ckpt", "demo", "-n", "2", *args, timeout=WALL_S)
    finish(faulty, result, *args)
    assert_same_as(faulty, clean_model)


def test_two_workers_and_a_replacement_killed_in_one_run(
    faulty: MemevalProject, clean_truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three scenarios, each killing the worker that starts it: with two workers, at least
    # one of the three deaths is a replacement's.
    monkeypatch.setenv("WORKER_FAULT", f"scenario:{IDS[1]},{IDS[3]},{IDS[5]}")
    result = faulty.run("--ckpt", "demo", "-n", "2", timeout=WALL_S)
    out = result.stdout.str()
    # Each death named (the failure section and, at a wide terminal, the short summary both
    # say it: count the distinct ones).
    crashes = set(re.findall(r"worker '(gw\d+)' crashed while running '([^']+)'", out))
    assert len(crashes) == 3, out
    assert "replacing crashed worker" in out, out
    finish(faulty, result)
    assert_same_as(faulty, clean_truth)


def test_a_stopped_worker_ends_the_run_after_the_stall_timeout(
    faulty: MemevalProject, clean_truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # SIGSTOP: the worker neither works nor dies. The run stops after the stall timeout with
    # one message naming the worker and the items it holds, unfinished and resumable.
    monkeypatch.setenv("WORKER_STOP", f"scenario:{IDS[3]}")
    # The run waits this long, idle, after the other worker's last event. It must only exceed
    # the longest gap between that worker's events: its first item, which measures the fast
    # path's calibration (a fresh cache in the project's HOME) and decodes a batch, took about
    # 3 s on a 2-core machine running eight times as many processes as cores.
    stall_s = 8
    pid_file = faulty.path / "flags" / "stopped.pid"
    # Started as a CI job's background command is: with SIGINT ignored, inherited (the
    # watch must not depend on Python's own SIGINT handler being there).
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = faulty.run(
            "--ckpt", "demo", "-n", "2", "--memeval-stall-timeout", str(stall_s), timeout=WALL_S
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
        if pid_file.exists():  # stop what the test started, by pid, however it ended
            # xdist's teardown has usually killed it already.
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out
    assert f"no worker has reported anything for {stall_s} s" in out, out
    assert f"holds 'test_eval.py::test_final_query[{IDS[3]}]'" in out, out
    assert pid_file.exists()
    metrics = faulty.subset_metrics()
    assert metrics["complete"] is False and IDS[3] in metrics["missing"]
    monkeypatch.delenv("WORKER_STOP")
    finish(faulty, result)
    assert_same_as(faulty, clean_truth)
