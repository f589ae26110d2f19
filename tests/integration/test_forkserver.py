"""The tests' fork server (``tests/forkserver.py``) runs pytest as a fresh interpreter would.

A run forked from it, and the xdist workers that run starts, see their own directory,
environment and ``sys.path``, draw their own random numbers and run other programs as the
real interpreter would: what a fresh ``python -m pytest`` sees, less what the server shares
with them (torch imported, the launcher as ``sys.executable``). A program a test starts
through ``forkserver.interpreter()`` (``-m MODULE``, ``-c CODE``) sees what it would see
started with ``sys.executable``: its arguments, directory, environment, ``sys.path``, standard
streams and their buffering, and it ends with the same status, a signal included. Worker
crashes under the server are exercised by ``test_worker_faults.py``, whose runs go through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


PROBE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "marker": os.environ.get("FORK_MARKER"),
    "stdin": sys.stdin.read(),
    "line_buffered": sys.stdout.line_buffering,
    "write_through": sys.stdout.write_through,
    "main": __name__,
    "torch": "torch" in sys.modules,
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def _probe(python: str, env: dict[str, str], cwd: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, *args], cwd=cwd, env=env, input="fed in", capture_output=True, text=True
    )
    seen: dict[str, Any] = json.loads(done.stdout) if done.stdout else {}
    return {"returncode": done.returncode, "stderr": done.stderr, **seen}


def test_a_program_started_through_the_interpreter_sees_what_a_fresh_one_sees(
    tmp_path: Path,
) -> None:
    assert forkserver.shared() is not None, "the fork server is off in this session"
    (tmp_path / "probe_module.py").write_text(PROBE, "utf-8")
    programs = {
        "module": ("-m", "probe_module", "a b", "--flag=1"),
        "joined": ("-mprobe_module", "x"),
        "code": ("-c", PROBE, "first", "second"),
        "unbuffered": ("-u", "-m", "probe_module"),
    }
    for exit_code, unbuffered_env in (("0", False), ("3", True)):
        env = {**os.environ, "FORK_MARKER": f"exit {exit_code}", "PROBE_EXIT": exit_code}
        if unbuffered_env:
            env["PYTHONUNBUFFERED"] = "1"
        python = forkserver.interpreter(env)
        assert python.executable != sys.executable
        for name, args in programs.items():
            fresh = _probe(sys.executable, env, tmp_path, *args)
            forked = _probe(python.executable, python.env, tmp_path, *args)
            assert fresh["returncode"] == int(exit_code) and fresh["stderr"] == "to stderr\n"
            assert (fresh.pop("torch"), forked.pop("torch")) == (False, True)  # by design
            assert forked == fresh, name
    # A program that dies of a signal ends the launcher with that signal.
    python = forkserver.interpreter()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        die = f"import os; os.kill(os.getpid(), {int(signum)})"
        assert _probe(python.executable, python.env, tmp_path, "-c", die)["returncode"] == -signum
    # What the launcher does not fork, the real interpreter runs.
    script = tmp_path / "script.py"
    script.write_text(PROBE, "utf-8")
    fresh = _probe(sys.executable, python.env, tmp_path, "-X", "utf8", str(script))
    execd = _probe(python.executable, python.env, tmp_path, "-X", "utf8", str(script))
    assert fresh == execd and execd["torch"] is False and execd["argv"] == [str(script)]
