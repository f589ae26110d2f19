"""Pytest runs started from a process that has already imported torch, transformers and peft.

Most of this suite's time went into starting the pytest runs its tests make: each fresh
interpreter imports torch, transformers' modelling code and peft before it decodes a turn
(about 7 s of CPU on the 2-core CI machine, against a second or two of actual work for a
demo run). A fork server pays that once per test worker: it imports those libraries, then
forks one child per run, which sets the run's working directory, environment, arguments and
output files and enters ``python -m pytest`` as a fresh interpreter would. The plugin itself,
pytest's plugins and the project's modules are not imported before the fork (pytest must see
them imported fresh, for assertion rewriting and for their import-time state), so a run under
the fork server executes exactly the code a fresh ``python -m pytest`` does; what it shares
is the already-executed import of third-party libraries that read nothing of the run's
environment at import.

Only the process pytester starts comes from the fork: the xdist workers it starts are fresh
interpreters, as in any run. ``MEMEVAL_TEST_FRESH_INTERPRETERS=1`` turns the server off
(every run a fresh interpreter, as before), to rule it out when a test misbehaves.

This file is both the client (imported by ``tests/conftest.py``) and the server (run as a
script: it must not import anything of ``tests``, or a project's own ``tests`` package would
find this one in ``sys.modules``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

#: What the server imports before it forks: the libraries every model-loading run imports,
#: none of them a pytest plugin (pytest warns about a plugin imported before it can rewrite it).
PRELOADED = (
    "numpy",
    "torch",
    "safetensors.torch",
    "tokenizers",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",
    "transformers.generation.utils",
    "peft",
    "jinja2",
)

OFF_SWITCH = "MEMEVAL_TEST_FRESH_INTERPRETERS"


# --- the server (run as a script) ------------------------------------------------------------


def _serve() -> None:  # pragma: no cover - runs in the server process
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    base_path = sys.path[1:]  # sys.path[0] is this file's folder
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    print(json.dumps({"ready": os.getpid()}), file=replies, flush=True)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            _child(request, base_path)
        print(json.dumps({"pid": pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        returncode = os.waitstatus_to_exitcode(status)  # -N for a signal, as Popen says it
        print(json.dumps({"returncode": returncode}), file=replies, flush=True)


def _child(request: dict[str, Any], base_path: list[str]) -> None:  # pragma: no cover
    """Become ``python -m pytest ARGS`` run in ``cwd`` with ``env``; never returns."""
    import atexit
    import random

    code: int = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        stdout = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        random.seed()  # a fresh interpreter seeds from the OS; the fork would share one state
        pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *pythonpath, *base_path]  # as `python -m` sets it
        import pytest

        sys.argv = [str(Path(pytest.__file__).parent / "__main__.py"), *request["args"]]
        code = pytest.console_main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)


# --- the client --------------------------------------------------------------------------------


class ForkedRun:
    """The part of :class:`subprocess.Popen` that ``Pytester.run`` uses, for a forked run."""

    stdin = None

    def __init__(self, server: ForkServer, cmdargs: tuple[str, ...], pid: int) -> None:
        self._server = server
        self.args = cmdargs
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self._server.reply(timeout, self.args)
            self.returncode = int(reply["returncode"])
            self._server.finished(self)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The server process of one test worker (started on the first run it is asked for)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._busy: ForkedRun | None = None

    def _start(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).parent,
        )
        self._process = process
        self.reply(300, ("fork server",))
        return process

    def reply(self, timeout: float | None, cmdargs: tuple[str, ...]) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        out = self._process.stdout
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired(list(cmdargs), timeout or 0)
        line = out.readline()
        if not line:
            raise RuntimeError("the tests' fork server ended (see tests/forkserver.py)")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def finished(self, run: ForkedRun) -> None:
        if self._busy is run:
            self._busy = None

    def popen(self, cmdargs: tuple[str, ...], stdout: IO[str], stderr: IO[str]) -> ForkedRun:
        """Start ``cmdargs`` (``python -mpytest ...``) as pytester would, forked."""
        if self._busy is not None:  # a run left behind (its test failed before waiting)
            self._busy.kill()
            self._busy.wait()
        process = self._process if self._process is not None else self._start()
        assert process.stdin is not None
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        request = {
            "args": list(cmdargs[2:]),
            "cwd": os.getcwd(),
            "env": env,
            "stdout": stdout.name,
            "stderr": stderr.name,
        }
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        run = ForkedRun(self, cmdargs, int(self.reply(60, cmdargs)["pid"]))
        self._busy = run
        return run

    def close(self) -> None:
        if self._process is not None:
            if self._busy is not None:
                self._busy.kill()
            self._process.kill()
            self._process.wait()
            self._process = None


def enabled() -> bool:
    """Whether runs go through the fork server (not when it is switched off)."""
    return os.environ.get(OFF_SWITCH, "") in ("", "0")


if __name__ == "__main__":
    _serve()
