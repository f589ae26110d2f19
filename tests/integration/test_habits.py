"""Pytest habits never destroy a finished run (issue 10.4), the run lock, and progress lines.

After a finished run, ``--lf``, ``-k``, ``--deselect``, ``-x`` and an interrupt write their
(unfinished) run under ``runs/<ckpt>/subsets/<time>/`` and leave the top level byte for byte;
a new finished run replaces the top level and keeps the one before in ``previous/``;
``--memeval-resume`` continues the interrupted run and promotes it when it finishes. The
habit matrix runs on a replay profile (no model: seconds per run) with and without xdist;
the real demo model shows the same under ``-n 2``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_memeval.core.runlayout import promote, resume_target, stranded
from pytest_memeval.core.runlock import LOCK_NAME, LockHeld, RunLock, read_holder
from pytest_memeval.runtime.progress import Progress, format_duration

from ..conftest import MemevalProject, demo_records
from ..faults import FAULTS_CONFTEST
from ..runfactory import write_crafted

RUN_FILES = ("metrics.json", "predictions.jsonl", "journal.jsonl")


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RUN_FILES}


def _crafted(project: MemevalProject, n: int = 4) -> list[str]:
    """A replay project whose first scenario has a wrong final answer (its only failure):
    ``--lf`` then selects that one scenario. The cache plugin stays on (``--lf`` needs it)."""
    recs = demo_records("baseline", n)
    write_crafted(project, recs, cache=True, wrong_final=[recs[0]["id"]])
    return [r["id"] for r in recs]


def _assert_beside(project: MemevalProject, result: pytest.RunResult, before: set[Path]) -> Path:
    """The run was written to a new subsets/<time>/ and the summary says so."""
    new = [p for p in project.subsets("crafted") if p not in before]
    assert len(new) == 1, (new, result.stdout.str())
    subset = new[0]
    metrics = json.loads((subset / "metrics.json").read_text("utf-8"))
    assert metrics["complete"] is False
    assert metrics["missing"] or metrics["not_selected"]
    result.stdout.fnmatch_lines(
        [
            f"run directory: {subset} (not finished: written beside the finished run)",
            f"{project.run_dir('crafted')} keeps the finished run of * (compare, the gate and "
            "report read that one)",
        ]
    )
    return subset


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_habits_leave_the_finished_run_alone(
    memeval_project: MemevalProject, xdist: list[str]
) -> None:
    ids = _crafted(memeval_project)
    top = memeval_project.run_dir("crafted")
    full = memeval_project.run("--ckpt", "crafted", *xdist)
    assert full.ret == 1, full.stdout.str()  # one wrong answer
    assert memeval_project.metrics("crafted")["complete"] is True
    full.stdout.fnmatch_lines([f"run directory: {top}"])
    finished = _snapshot(top)

    habits: list[tuple[str, ...]] = [
        ("--lf",),
        ("-k", ids[1]),
        (
            "--deselect",
            f"test_eval.py::test_final_query[{ids[2]}]",
            "--deselect",
            f"test_eval.py::test_turns[{ids[2]}]",
        ),
    ]
    if not xdist:
        # Serial -x stops at the first failure (scenario 1) for sure; under xdist the
        # workers may finish every item before the stop reaches them.
        habits.append(("-x",))
    for habit in habits:
        before = set(memeval_project.subsets("crafted"))
        result = memeval_project.run("--ckpt", "crafted", *xdist, *habit)
        subset = _assert_beside(memeval_project, result, before)
        assert _snapshot(top) == finished, f"{habit} changed the finished run"
        assert not (top / "previous").exists()
        sub = json.loads((subset / "metrics.json").read_text("utf-8"))
        if habit == ("--lf",):
            assert sub["n"] == 1 and sub["not_selected"] == ids[1:]
        if habit == ("-x",):
            assert sub["n"] == 1 and sub["missing"] == ids[1:]
    assert len(memeval_project.subsets("crafted")) == len(habits)

    # The tools keep reading the finished run.
    recount = subprocess.run(
        [sys.executable, "-m", "pytest_memeval", "recount", str(top)],
        capture_output=True,
        text=True,
    )
    assert recount.returncode == 0, recount.stderr

    # A new finished run takes the top level and keeps the one it replaced.
    again = memeval_project.run("--ckpt", "crafted", *xdist)
    again.stdout.fnmatch_lines([f"the finished run it replaced is kept in {top / 'previous'}"])
    assert _snapshot(top / "previous") == finished
    assert memeval_project.metrics("crafted")["complete"] is True
    assert len(memeval_project.subsets("crafted")) == len(habits)  # subsets stay where they are
    assert not (top / LOCK_NAME).exists()


@pytest.mark.slow
def test_interrupt_then_resume_promotes_and_keeps_previous(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _crafted(memeval_project, n=3)
    memeval_project.pytester.makeconftest(FAULTS_CONFTEST)
    top = memeval_project.run_dir("crafted")
    assert memeval_project.run("--ckpt", "crafted").ret == 1
    finished = _snapshot(top)

    monkeypatch.setenv("FAULT_INTERRUPT", ids[1])
    interrupted = memeval_project.run("--ckpt", "crafted")
    assert interrupted.ret == pytest.ExitCode.INTERRUPTED
    subset = _assert_beside(memeval_project, interrupted, set())
    assert _snapshot(top) == finished
    interrupted.stdout.fnmatch_lines(
        [
            "progress: 1/3 scenarios evaluated in *; 2 not evaluated: about * more at *",
            f"the 1 finished scenario(s) are kept in {subset / 'journal.jsonl'}; rerun with "
            "--memeval-resume*",
        ]
    )
    assert not (top / LOCK_NAME).exists(), "an interrupted run releases its lock"

    monkeypatch.delenv("FAULT_INTERRUPT")
    resumed = memeval_project.run("--ckpt", "crafted", "--memeval-resume")
    assert resumed.ret == 0, resumed.stdout.str()  # the wrong answer is in the journal
    resumed.stdout.fnmatch_lines(
        [
            f"memeval: resuming the unfinished run in {subset}",
            "*resumed: 1 scenario(s) taken from the journal, 2 evaluated now",
            f"run directory: {top}",
            f"the finished run it replaced is kept in {top / 'previous'}",
        ]
    )
    assert memeval_project.subsets("crafted") == []  # the resumed run was promoted
    assert _snapshot(top / "previous") == finished
    now = memeval_project.metrics("crafted")
    first = json.loads(finished["metrics.json"])
    assert now["complete"] is True and now["scope"]["resumed"] == 1
    for key in ("n", "m1", "m2", "unaligned", "parse_fail", "m2_by_position"):
        assert now[key] == first[key], key


@pytest.mark.slow
def test_lf_after_a_full_demo_model_run_under_xdist(memeval_project: MemevalProject) -> None:
    """The issue's report with the real model: a full -n 2 run, then a subset of it."""
    recs = demo_records("oracle", 3)
    memeval_project.write(recs)
    top = memeval_project.run_dir()
    memeval_project.run("--ckpt", "demo", "-n", "2")
    assert memeval_project.metrics()["complete"] is True
    finished = _snapshot(top)
    subset = memeval_project.run("--ckpt", "demo", "-n", "2", "-k", recs[1]["id"])
    subset.stdout.fnmatch_lines(["subset run: 1 of 3 scenarios selected*"])
    assert _snapshot(top) == finished
    assert memeval_project.subset_metrics()["n"] == 1
    subset.stdout.fnmatch_lines([f"run directory: {memeval_project.latest_subset()} (not fin*"])


# -- the run lock ---------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from pytest_memeval.core.runlock import RunLock
RunLock.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout)


@pytest.mark.slow
def test_a_second_run_is_refused_naming_the_holder_and_a_stale_lock_is_taken_over(
    memeval_project: MemevalProject,
) -> None:
    _crafted(memeval_project, n=2)
    top = memeval_project.run_dir("crafted")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(top)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = top / LOCK_NAME
        held = lock.read_bytes()
        refused = memeval_project.run("--ckpt", "crafted", "-n", "2")
        assert refused.ret == pytest.ExitCode.USAGE_ERROR
        refused.stderr.fnmatch_lines(
            [
                f"ERROR: run directory {top} is in use by another run: pid {holder.pid} on host "
                f"{socket.gethostname()} since *; wait for it to finish, or write this run "
                "elsewhere with --memeval-out DIR"
            ]
        )
        assert sorted(p.name for p in top.iterdir()) == [LOCK_NAME]  # nothing written
        # --collect-only takes nothing and touches nothing.
        listed = memeval_project.run("--ckpt", "crafted", "--collect-only", "-q")
        assert listed.ret == 0, listed.stdout.str()
        assert lock.read_bytes() == held
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: it is now stale
        holder.wait()
    assert read_holder(lock) is not None
    taken = memeval_project.run("--ckpt", "crafted", "-n", "2")
    assert taken.ret == 1, taken.stdout.str()
    taken.stdout.fnmatch_lines(
        [
            f"memeval: took over a stale lock of pid {holder.pid} on host *, which is no longer "
            "running"
        ]
    )
    assert memeval_project.metrics("crafted")["complete"] is True
    assert not lock.exists(), "released at the end"


WAITING_CONFTEST = """
import os, time
from pathlib import Path

def pytest_runtest_setup(item):
    hold = os.environ.get("HOLD_FILE")
    if not hold:
        return
    Path(hold + ".started").touch()
    deadline = time.time() + 240
    while not Path(hold).exists() and time.time() < deadline:
        time.sleep(0.1)
"""


@pytest.mark.slow
def test_two_runs_at_once_the_second_is_refused_the_first_finishes(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    """The issue's report: two runs into one run directory. Today the first one dies at
    session finish (its journal rotated by the second); now the second refuses to start."""
    _crafted(memeval_project, n=2)
    memeval_project.pytester.makeconftest(WAITING_CONFTEST)
    hold = tmp_path / "hold"
    env = {**os.environ, "HOLD_FILE": str(hold)}
    first = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--ckpt", "crafted", "-n", "2", "-p", "no:randomly"],
        cwd=memeval_project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while not Path(str(hold) + ".started").exists() and time.time() < deadline:
            assert first.poll() is None, first.communicate()[0]
            time.sleep(0.2)
        second = memeval_project.run("--ckpt", "crafted")
        assert second.ret == pytest.ExitCode.USAGE_ERROR
        second.stderr.fnmatch_lines([f"ERROR: *is in use by another run: pid {first.pid} on *"])
    finally:
        hold.touch()
        out = first.communicate(timeout=240)[0]
    assert first.returncode == 1, out  # one wrong answer, no INTERNALERROR
    assert "INTERNALERROR" not in out
    metrics = memeval_project.metrics("crafted")
    assert metrics["complete"] is True and metrics["n"] == 2


def test_lock_unit(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "x"
    lock = RunLock.acquire(run_dir)
    holder = read_holder(run_dir / LOCK_NAME)
    assert holder is not None and holder["pid"] == os.getpid()
    assert holder["host"] == socket.gethostname()
    with pytest.raises(LockHeld, match=f"in use by another run: pid {os.getpid()} on host"):
        RunLock.acquire(run_dir)
    lock.release()
    assert not run_dir.exists(), "a run directory the run created and left empty is removed"

    # A lock of a dead process on this host is stale: taken over, and said so.
    run_dir.mkdir(parents=True)
    dead = {**holder, "pid": _dead_pid(), "proc_start": None}
    (run_dir / LOCK_NAME).write_text(json.dumps(dead), "utf-8")
    lock = RunLock.acquire(run_dir)
    assert lock.took_over == dead
    # Our release never removes a lock that is not ours.
    other = {**holder, "pid": 1, "started": "then"}
    (run_dir / LOCK_NAME).write_text(json.dumps(other), "utf-8")
    lock.release()
    assert read_holder(run_dir / LOCK_NAME) == other

    # Another host cannot be checked: refused, saying how to take it over by hand.
    remote = {**holder, "host": "gpu-node-7"}
    (run_dir / LOCK_NAME).write_text(json.dumps(remote), "utf-8")
    with pytest.raises(LockHeld, match=r"gpu-node-7.*delete .*memeval\.lock and run again"):
        RunLock.acquire(run_dir)
    # A recycled pid (alive, but another process start time) is not the holder.
    (run_dir / LOCK_NAME).write_text(json.dumps({**holder, "proc_start": "1"}), "utf-8")
    if Path(f"/proc/{os.getpid()}/stat").exists():
        assert RunLock.acquire(run_dir).took_over is not None
    (run_dir / LOCK_NAME).write_text("garbage", "utf-8")
    with pytest.raises(LockHeld, match="unreadable lock"):
        RunLock.acquire(run_dir)


@pytest.mark.slow
def test_resume_never_rewrites_the_finished_run(memeval_project: MemevalProject) -> None:
    """--memeval-resume where the newest run is the finished one: nothing to do leaves it as
    it is; a finished run whose journal lacks a scenario is continued in a copy and promoted;
    a damaged metrics.json is no finished run (resumed in place, no INTERNALERROR)."""
    _crafted(memeval_project, n=3)
    top = memeval_project.run_dir("crafted")
    assert memeval_project.run("--ckpt", "crafted").ret == 1
    finished = _snapshot(top)

    nothing = memeval_project.run("--ckpt", "crafted", "--memeval-resume")
    assert nothing.ret == 0, nothing.stdout.str()
    nothing.stdout.fnmatch_lines([f"nothing to resume: {top} holds the finished run*"])
    assert _snapshot(top) == finished, "the finished run was rewritten"
    assert not (top / "previous").exists() and memeval_project.subsets("crafted") == []

    journal = top / "journal.jsonl"
    lines = journal.read_text("utf-8").splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]), "utf-8")  # header + 2 of the 3 records
    short = _snapshot(top)
    more = memeval_project.run("--ckpt", "crafted", "--memeval-resume")
    assert more.ret in (0, 1), more.stdout.str()
    more.stdout.fnmatch_lines(
        [
            "*resumed: 2 scenario(s) taken from the journal, 1 evaluated now",
            f"run directory: {top}",
            f"the finished run it replaced is kept in {top / 'previous'}",
        ]
    )
    assert _snapshot(top / "previous") == short
    assert memeval_project.metrics("crafted")["complete"] is True
    assert memeval_project.subsets("crafted") == []

    (top / "metrics.json").write_text("{ damaged", "utf-8")
    repaired = memeval_project.run("--ckpt", "crafted", "--memeval-resume")
    output = repaired.stdout.str() + repaired.stderr.str()
    assert repaired.ret == 0 and "INTERNALERROR" not in output, output
    assert memeval_project.metrics("crafted")["complete"] is True
    recount = subprocess.run(
        [sys.executable, "-m", "pytest_memeval", "recount", str(top)],
        capture_output=True,
        text=True,
    )
    assert recount.returncode == 0, recount.stderr


@pytest.mark.slow
def test_sessions_that_evaluate_nothing_take_no_lock_and_an_unusable_out_is_one_error(
    memeval_project: MemevalProject,
) -> None:
    _crafted(memeval_project, n=2)
    top = memeval_project.run_dir("crafted")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(top)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        held = (top / LOCK_NAME).read_bytes()
        for args in (("--fixtures",), ("--markers",), ("--help",), ("--fixtures-per-test",)):
            shown = memeval_project.run("--ckpt", "crafted", *args)
            assert shown.ret == 0, (args, shown.stdout.str(), shown.stderr.str())
            assert "in use by another run" not in shown.stderr.str()
        assert (top / LOCK_NAME).read_bytes() == held
        assert sorted(p.name for p in top.iterdir()) == [LOCK_NAME]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    blocker = memeval_project.path / "a file"
    blocker.write_text("", "utf-8")
    unusable = blocker / "out"
    result = memeval_project.run("--ckpt", "crafted", "--memeval-out", str(unusable))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        [f"ERROR: pytest-memeval: cannot lock the run directory {unusable} *"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.slow
def test_a_promotion_cut_short_is_kept_and_reported(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    def run_files(where: Path, tag: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (where / name).write_text(json.dumps({"created": tag}), "utf-8")

    # In process, a hidden directory with this process's pid (containers recycle pids): a
    # later promotion picks another name and leaves it alone.
    run_dir = tmp_path / "run"
    cut_short = run_dir / f".previous.{os.getpid()}.tmp"
    run_files(cut_short, "stranded")
    run_files(run_dir, "top")
    run_files(run_dir / "subsets" / "20260101T000000Z", "new")
    assert promote(run_dir / "subsets" / "20260101T000000Z", run_dir) == run_dir / "previous"
    assert json.loads((cut_short / "metrics.json").read_text("utf-8")) == {"created": "stranded"}
    assert json.loads((run_dir / "previous" / "metrics.json").read_text("utf-8")) == {
        "created": "top"
    }
    assert json.loads((run_dir / "metrics.json").read_text("utf-8")) == {"created": "new"}
    assert stranded(run_dir) == [cut_short]

    # A run names it in its header and summary.
    _crafted(memeval_project, n=2)
    top = memeval_project.run_dir("crafted")
    assert memeval_project.run("--ckpt", "crafted").ret == 1
    left = top / ".previous.4242.tmp"
    run_files(left, "2026-12-01T10:00:00+00:00")
    again = memeval_project.run("--ckpt", "crafted")
    expected = (
        f"memeval: {left} holds a finished run (created 2026-12-01T10:00:00+00:00) that an "
        "interrupted promotion left behind; nothing reads it there: move its files back into "
        f"{top} or {top / 'previous'}, or delete it"
    )
    assert again.stdout.lines.count(expected) == 2, again.stdout.str()  # header and summary
    assert stranded(top) == [left]


def test_resume_target_takes_a_damaged_metrics_for_no_finished_run(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text("{ damaged", "utf-8")
    (tmp_path / "journal.jsonl").write_text("", "utf-8")
    assert resume_target(tmp_path) == tmp_path  # no JSONDecodeError (an INTERNALERROR)
    subset = tmp_path / "subsets" / "20200101T000000Z"
    subset.mkdir(parents=True)
    (subset / "journal.jsonl").write_text("", "utf-8")
    assert resume_target(tmp_path) == subset


REPLACEMENT_FAILS_CONFTEST = """
import os, signal
from pathlib import Path

import pytest

DIED = Path(os.environ["DIED_FILE"])


def pytest_runtest_setup(item):
    callspec = getattr(item, "callspec", None)
    sid = callspec.params.get("memeval_scenario") if callspec else None
    if sid == os.environ.get("KILL_AT") and not DIED.exists():
        DIED.touch()
        os.kill(os.getpid(), signal.SIGKILL)  # xdist starts a replacement worker


@pytest.hookimpl(tryfirst=True)
def pytest_memeval_make_decoder(config, profile, path, device):
    if DIED.exists():
        raise OSError("the weights are gone (injected)")  # the replacement cannot load
"""


@pytest.mark.slow
def test_a_replacement_worker_that_fails_says_where_the_finished_scenarios_are(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ids = _crafted(memeval_project, n=6)
    memeval_project.pytester.makeconftest(REPLACEMENT_FAILS_CONFTEST)
    died = tmp_path / "died"
    monkeypatch.setenv("DIED_FILE", str(died))
    monkeypatch.setenv("KILL_AT", ids[-1])
    result = memeval_project.run("--ckpt", "crafted", "-n", "2")
    output = result.stdout.str() + result.stderr.str()
    assert died.exists() and result.ret != 0, output
    assert "the weights are gone (injected)" in output
    assert "nothing was written" not in output
    subset = memeval_project.latest_subset("crafted")
    journal = subset / "journal.jsonl"
    assert len(journal.read_text("utf-8").splitlines()) > 1, "records were journaled"
    assert f"the scenarios evaluated before are kept in {journal}: rerun with --memeval-resume" in (
        " ".join(output.split())
    )

    died.unlink()
    monkeypatch.delenv("KILL_AT")
    resumed = memeval_project.run("--ckpt", "crafted", "-n", "2", "--memeval-resume")
    resumed.stdout.fnmatch_lines([f"memeval: resuming the unfinished run in {subset}"])
    assert memeval_project.metrics("crafted")["complete"] is True


# -- progress -------------------------------------------------------------------------------


def test_progress_is_time_based_not_per_item() -> None:
    now = [100.0]
    progress = Progress(interval=3.0, clock=lambda: now[0])
    printed = []
    for _ in range(10):
        now[0] += 1.0
        progress.add()
        if progress.due():
            printed.append(progress.line(10))
    # 10 records one second apart, a line at most every 3 s: 3 lines, not 10.
    assert printed == [
        "4/10 scenarios (40.0%), 1.00 scenarios/s, ETA 6s",
        "7/10 scenarios (70.0%), 1.00 scenarios/s, ETA 3s",
        "10/10 scenarios (100.0%), 1.00 scenarios/s, ETA 0s",
    ]
    assert Progress(0.0).due() is False
    assert progress.summary(12, 2, 20.0) == (
        "progress: 10/12 scenarios evaluated in 20s (0.50 scenarios/s); 2 not evaluated: "
        "about 2s more at 1.00 scenarios/s (the rate once scenarios came in)"
    )
    # One record: no rate between records yet, so the session's rate is all there is.
    single = Progress(interval=3.0, clock=lambda: 5.0)
    single.add()
    assert single.summary(3, 2, 10.0) == (
        "progress: 1/3 scenarios evaluated in 10s (0.10 scenarios/s); 2 not evaluated: "
        "about 20s more at that rate"
    )
    assert [format_duration(s) for s in (5, 61, 7325)] == ["5s", "1m 01s", "2h 02m"]


SLOW_CONFTEST = """
import time

def pytest_runtest_setup(item):
    if getattr(item, "callspec", None) is not None:
        time.sleep(0.4)  # scenarios take a while, as on a real model
"""


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_progress_lines_while_the_run_goes(
    memeval_project: MemevalProject, xdist: list[str]
) -> None:
    _crafted(memeval_project, n=4)
    memeval_project.pytester.makeconftest(SLOW_CONFTEST)
    result = memeval_project.run("--ckpt", "crafted", "--memeval-progress", "0.5", *xdist)
    # Each progress line is a line of its own (not glued to pytest's dots).
    lines = [x for x in result.stdout.lines if x.startswith("memeval: ") and "/4 scen" in x]
    assert lines, result.stdout.str()
    assert not [x for x in result.stdout.lines if "memeval: " in x[1:]], result.stdout.str()
    assert any("scenarios/s, ETA " in line for line in lines), lines
    result.stdout.fnmatch_lines(["progress: 4/4 scenarios evaluated in * (* scenarios/s)"])

    quiet = memeval_project.run("--ckpt", "crafted", "--memeval-progress=0.5", "-qq", *xdist)
    assert not [x for x in quiet.stdout.lines if "/4 scenarios (" in x], quiet.stdout.str()

    if not xdist:
        # This command carries no -n: it is the same under either parameter, so it runs once.
        bad = memeval_project.run("--ckpt", "crafted", "--memeval-progress", "soon")
        assert bad.ret == pytest.ExitCode.USAGE_ERROR
        bad.stderr.fnmatch_lines(["*--memeval-progress: expected seconds (a number), got 'soon'*"])
