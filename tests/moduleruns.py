"""pytest runs made once per test module and read by several tests.

``pytester`` is function-scoped: a run made through it belongs to one test. A module-scoped
fixture lays its project out under ``tmp_path_factory.mktemp(...)`` and runs pytest there with
:func:`run_pytest`, a subprocess in the environment pytester gives its own (no outer
``PYTEST_ADDOPTS``, no CI job summary, no colours, the project as ``HOME``), and gets pytester's
:class:`pytest.RunResult` back (``assert_outcomes``, ``stdout.fnmatch_lines``...).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from . import forkserver

# The outer session's settings, which a user's run would not have: its PYTEST_ADDOPTS, and
# the CI job summary file (a test's run must not write into the real job's summary).
OUTER_ONLY = ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY")


def run_pytest(
    root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> pytest.RunResult:
    """``python -m pytest ARGS`` in ``root`` (``env``: variables set on top)."""
    environ = {k: v for k, v in os.environ.items() if k not in OUTER_ONLY}
    environ.update(PY_COLORS="0", HOME=str(root), **(env or {}))
    basetemp = root / "runpytest" / uuid.uuid4().hex[:8]
    basetemp.parent.mkdir(exist_ok=True)  # pytest makes the base temp itself, not its parent
    command = (sys.executable, "-mpytest", f"--basetemp={basetemp}", *args)
    out_file, err_file = basetemp.with_suffix(".stdout"), basetemp.with_suffix(".stderr")
    start = time.monotonic()
    server = forkserver.shared()  # forked from the worker's fork server where there is one
    with out_file.open("w", encoding="utf-8") as out, err_file.open("w", encoding="utf-8") as err:
        process: subprocess.Popen[str] | forkserver.ForkedRun = (
            subprocess.Popen(command, cwd=root, env=environ, stdout=out, stderr=err, text=True)
            if server is None
            else server.popen(command, out, err, cwd=str(root), env=environ)
        )
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return pytest.RunResult(
        returncode,
        out_file.read_text("utf-8").splitlines(),
        err_file.read_text("utf-8").splitlines(),
        time.monotonic() - start,
    )
