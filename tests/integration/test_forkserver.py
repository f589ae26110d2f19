"""The tests' fork server (``tests/forkserver.py``) runs pytest as a fresh interpreter would.

A run forked from it, and the xdist workers that run starts, see their own directory,
environment and ``sys.path``, draw their own random numbers and run other commands with the
real interpreter: what a fresh ``python -m pytest`` sees, less what the server shares with
them (torch imported, the launcher as ``sys.executable``). Worker crashes under the server
are exercised by ``test_worker_faults.py``, whose runs go through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .. import forkserver
from ..conftest import MemevalProject

pytestmark = pytest.mark.slow

SEEN = """
import json
import os
import random
import subprocess
import sys


def pytest_sessionfinish(session):
    process = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    seen = {
        "cwd": os.getcwd(),
        "marker": os.environ.get("FORK_MARKER"),
        "path": sys.path,
        "argv": sys.argv[1:],
        "random": random.random(),
        "torch": "torch" in sys.modules,
        "pid": os.getpid(),
        "python": subprocess.check_output([sys.executable, "-c", "print(6 * 7)"], text=True),
        "stdout_line_buffered": sys.stdout.line_buffering,
        "stdin_closed": sys.stdin.closed,
    }
    (session.config.rootpath / f"seen-{process}.json").write_text(json.dumps(seen))
"""

#: What differs between a fresh interpreter and a fork by design.
SHARED_BY_DESIGN = ("random", "torch", "pid")


def _seen(path: Path) -> dict[str, dict[str, Any]]:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(path.glob("seen-*.json"))}
    for p in path.glob("seen-*.json"):
        p.unlink()
    return found


def test_a_forked_run_and_its_workers_see_what_fresh_interpreters_see(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert forkserver.shared() is not None, "the fork server is off in this session"
    path = memeval_project.path
    memeval_project.pytester.makeconftest(SEEN)
    memeval_project.pytester.makepyfile(test_x="def test_x():\n    pass\n")
    args = ("-n", "2", "-p", "no:randomly", "-p", "no:cacheprovider")

    monkeypatch.setenv("FORK_MARKER", "fresh")
    fresh_result = memeval_project.pytester.runpytest_subprocess(*args)
    assert fresh_result.ret == 0, fresh_result.stdout.str()
    fresh = _seen(path)
    forked = {}
    for marker in ("one", "two"):
        monkeypatch.setenv("FORK_MARKER", marker)
        result = memeval_project.run(*args)
        assert result.ret == 0, result.stdout.str() + result.stderr.str()
        result.assert_outcomes(passed=1)
        forked[marker] = _seen(path)

    assert set(fresh) == {"seen-controller", "seen-gw0", "seen-gw1"}
    for marker, processes in forked.items():
        assert set(processes) == set(fresh)
        for name, seen in processes.items():
            assert seen["torch"] is True  # imported before the fork
            expected = {k: v for k, v in fresh[name].items() if k not in SHARED_BY_DESIGN}
            expected["marker"] = marker
            # --basetemp differs per run (pytester numbers them)
            expected["argv"] = [a for a in expected["argv"] if not a.startswith("--basetemp")]
            got = {k: v for k, v in seen.items() if k not in SHARED_BY_DESIGN}
            got["argv"] = [a for a in got["argv"] if not a.startswith("--basetemp")]
            assert got == expected, name
    draws = [s["random"] for processes in (fresh, *forked.values()) for s in processes.values()]
    assert len(set(draws)) == len(draws)  # every process seeded its own
    assert fresh["seen-controller"]["torch"] is False  # a fresh controller of a plain run
