"""The run lock is taken only by a session that evaluates something (after collection).

With ``--ckpt`` in ``addopts``, a plain ``pytest test_other.py`` must not collide with an
eval that holds the run directory; an eval session that selects even one scenario is still
refused, with one message and nothing written, with and without xdist.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pytest_memeval.core.runlock import LOCK_NAME

from ..conftest import MemevalProject, demo_records
from ..runfactory import write_crafted

SLOW = pytest.mark.slow

HOLDER = """
import sys, time
from pathlib import Path
from pytest_memeval.core.runlock import RunLock
RunLock.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def held_project(memeval_project: MemevalProject) -> Iterator[MemevalProject]:
    """A replay project (no model: seconds per run) whose run directory another process holds."""
    recs = demo_records("baseline", 3)
    write_crafted(memeval_project, recs, cache=False, wrong_final=[])
    memeval_project.pytester.makepyfile(test_other="def test_other():\n    assert 1 + 1 == 2\n")
    top = memeval_project.run_dir("crafted")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(top)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield memeval_project
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers", [pytest.param([], id="no-xdist"), pytest.param(["-n", "2"], id="n2", marks=SLOW)]
)
def test_a_session_without_eval_items_runs_beside_a_held_run(
    held_project: MemevalProject, workers: list[str]
) -> None:
    top = held_project.run_dir("crafted")
    held = (top / LOCK_NAME).read_bytes()
    result = held_project.run("--ckpt", "crafted", *workers, "test_other.py")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*1 passed*"])
    assert "in use by another run" not in result.stderr.str()
    assert (top / LOCK_NAME).read_bytes() == held
    assert sorted(p.name for p in top.iterdir()) == [LOCK_NAME]  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers", [pytest.param([], id="no-xdist"), pytest.param(["-n", "2"], id="n2", marks=SLOW)]
)
def test_an_eval_session_selecting_one_scenario_is_still_refused(
    held_project: MemevalProject, workers: list[str]
) -> None:
    top = held_project.run_dir("crafted")
    held = (top / LOCK_NAME).read_bytes()
    first = demo_records("baseline", 1)[0]["id"]
    result = held_project.run("--ckpt", "crafted", *workers, "-k", first)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: run directory {top} is in use by another run: pid *"])
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert output.count("is in use by another run") == 1
    assert (top / LOCK_NAME).read_bytes() == held
    assert sorted(p.name for p in top.iterdir()) == [LOCK_NAME]  # nothing written
