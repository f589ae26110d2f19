"""Pytest runs, the xdist workers they start and the tests' other Python programs, forked
from a process that has already imported torch, transformers and peft.

Most of this suite's time went into starting processes: each fresh interpreter of a model run
imports torch, transformers' modelling code and peft before it decodes a turn (about 7 s of
CPU on the 2-core CI machine, against a second or two of actual work for a demo run), and a
``-n 2`` run starts three of them. A fork server pays that once per test worker. It imports
those libraries, then forks one child per process asked for:

* a **run** (``memeval_project.run``, ``run_forked``, ``moduleruns.run_pytest``): the child
  enters ``python -m pytest ARGS`` with the run's working directory, environment and output
  files, as pytester's subprocess would;
* a **launched program**: a forked run's ``sys.executable`` is a launcher (``forklaunch.py``),
  and so is the interpreter a test starts Python with through :func:`interpreter`. Given
  ``-c CODE`` or ``-m MODULE`` (execnet's start of an xdist worker, ``python -u -c ...``,
  among them), it hands the program, its standard streams, environment and directory to the
  server, whose child runs the program as that interpreter would. The launcher then holds no
  stream of its own: when the child dies, its pipes close and whoever reads them sees it die,
  as they would see a fresh interpreter die. The launcher ends with the child's status (a
  signal as that signal); killed itself, its child is killed. Any other command the launcher
  is given is the real interpreter's (``exec``).

The plugin itself, pytest and its plugins and the project's modules are not imported before
the fork (pytest must import them itself, for assertion rewriting and for their import-time
state), so a forked process executes exactly the code a fresh one does; what it shares is the
executed import of third-party libraries that read nothing of the run at import.

``MEMEVAL_TEST_FRESH_INTERPRETERS=1`` turns the server off (every run and worker a fresh
interpreter, as before), to rule it out when a test misbehaves; tests that check what a fresh
process imports call ``pytester.runpytest_subprocess`` themselves.

This file is both the client (imported by ``tests/conftest.py``) and the server (run as a
script: it must not import anything of ``tests``, or a project's own ``tests`` package would
find this one in ``sys.modules``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
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
#: The server's socket for launchers, in the environment of every run it forks.
SOCKET_VARIABLE = "MEMEVAL_TEST_FORK_SERVER"
#: The interpreter the launcher execs for anything but ``-c CODE`` or ``-m MODULE``.
PYTHON_VARIABLE = "MEMEVAL_TEST_PYTHON"
LAUNCHER = Path(__file__).with_name("forklaunch.py")


# --- the server (run as a script) ------------------------------------------------------------


class _Server:  # pragma: no cover - runs in the server process
    def __init__(self, launcher: str) -> None:
        self.launcher = launcher
        self.base_path = sys.path[1:]  # sys.path[0] is this file's folder
        self.requests = os.fdopen(os.dup(0), "rb", buffering=0)
        self.replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        self.socket_dir = tempfile.mkdtemp(prefix="memeval-forks-")
        self.address = os.path.join(self.socket_dir, "socket")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.address)
        self.listener.listen(16)
        self.runs: set[int] = set()  # pids of the runs the client asked for
        self.launched: dict[int, socket.socket] = {}  # pid of a launched child -> its launcher
        self.pending = b""

    def reply(self, message: dict[str, Any]) -> None:
        print(json.dumps(message), file=self.replies, flush=True)

    def serve(self) -> None:
        self.reply({"ready": os.getpid(), "socket": self.address})
        while True:
            readable, _, _ = select.select(
                [self.requests, self.listener, *self.launched.values()], [], [], 0.05
            )
            for source in readable:
                if source is self.requests:
                    if not self.read_requests():
                        return
                elif source is self.listener:
                    self.spawn_launched()
                else:
                    self.launcher_gone(source)
            self.reap()

    def read_requests(self) -> bool:
        chunk = self.requests.read(1 << 16)
        if not chunk:
            return False  # the client closed: the session is over
        self.pending += chunk
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            pid = self.fork(functools.partial(_run, json.loads(line), self))
            self.runs.add(pid)
            self.reply({"pid": pid})
        return True

    def spawn_launched(self) -> None:
        connection, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
        pid = self.fork(functools.partial(_launched, request, fds, self, connection))
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        self.launched[pid] = connection

    def launcher_gone(self, connection: socket.socket) -> None:
        for pid, held in self.launched.items():
            if held is connection:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # reaped below
                return

    def fork(self, become: Any) -> int:
        pid = os.fork()
        if pid == 0:
            become()  # never returns
        return pid

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            returncode = os.waitstatus_to_exitcode(status)  # -N for a signal, as Popen says
            if pid in self.runs:
                self.runs.discard(pid)
                self.reply({"returncode": returncode})
            elif pid in self.launched:
                connection = self.launched.pop(pid)
                with contextlib.suppress(OSError):
                    connection.sendall(json.dumps({"returncode": returncode}).encode() + b"\n")
                connection.close()

    def close_in_child(self) -> None:
        for held in (self.requests, self.replies, self.listener, *self.launched.values()):
            with contextlib.suppress(OSError):
                held.close()


def _enter(request: dict[str, Any], server: _Server, first_path: str) -> None:  # pragma: no cover
    """The part of a fresh interpreter's start a child repeats: directory, environment,
    ``sys.path``, seeded randomness."""
    import random

    server.close_in_child()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    pythonpath = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first_path, *pythonpath, *server.base_path]
    random.seed()  # a fresh interpreter seeds from the OS; forks would share one state
    # What a fresh interpreter reads from its environment and a fork can still change.
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    sys.executable = server.launcher


def _streams(stdin: int, stdout: int, stderr: int, *, unbuffered: bool) -> None:  # pragma: no cover
    import io

    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    # The process's own streams, open for its life (no context manager).
    stdin_binary = open(0, "rb", closefd=False)  # noqa: SIM115
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(stdin_binary, encoding="utf-8")
    for number, name in ((1, "stdout"), (2, "stderr")):
        # As the interpreter opens them: `-u` unbuffered; else stdout block-buffered (line-
        # buffered to a terminal) and stderr line-buffered.
        binary: Any = open(number, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
        text = io.TextIOWrapper(
            binary,
            encoding="utf-8",
            errors="backslashreplace" if name == "stderr" else "strict",
            line_buffering=not unbuffered and (name == "stderr" or os.isatty(number)),
            write_through=unbuffered,
        )
        setattr(sys, name, text)
        setattr(sys, f"__{name}__", text)


def _exit_with(body: Any) -> None:  # pragma: no cover
    """Run ``body`` as an interpreter's main program would run, then end the process."""
    code: int = 1
    try:
        body()
        code = 0
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


def _run(request: dict[str, Any], server: _Server) -> None:  # pragma: no cover
    """Become ``python -m pytest ARGS`` run in ``cwd`` with ``env``; never returns."""

    def pytest_main() -> None:
        _enter(request, server, request["cwd"])  # `python -m` puts the directory first
        stdin = os.open(os.devnull, os.O_RDONLY)
        stdout = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _streams(stdin, stdout, stderr, unbuffered=False)
        import pytest

        sys.argv = [str(Path(pytest.__file__).parent / "__main__.py"), *request["args"]]
        raise SystemExit(pytest.console_main())

    _exit_with(pytest_main)


def _launched(
    request: dict[str, Any], fds: list[int], server: _Server, launcher: socket.socket
) -> None:  # pragma: no cover
    """Become ``python [-u] -c CODE ARGS`` or ``python [-u] -m MODULE ARGS`` on the launcher's
    streams; never returns."""

    def program() -> None:
        import types

        launcher.close()
        module = request.get("module")
        # `python -m` puts the directory first on sys.path, `python -c` the empty string.
        _enter(request, server, request["cwd"] if module else "")
        unbuffered = request["unbuffered"] or bool(request["env"].get("PYTHONUNBUFFERED"))
        _streams(*fds, unbuffered=unbuffered)
        sys.argv = list(request["argv"])
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        if module:
            import runpy

            # What `python -m` itself calls: sys.argv[0] becomes the module's file.
            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
        else:
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)

    _exit_with(program)


def _forget_pytest_plugins() -> None:  # pragma: no cover - runs in the server process
    """Drop from ``sys.modules`` the packages of pytest plugins the preloaded libraries
    imported (anyio, through httpx): pytest warns of a plugin it finds imported before it
    could rewrite its asserts, and a fresh interpreter imports them when pytest loads them."""
    from importlib.metadata import entry_points

    packages = {ep.value.split(":")[0].split(".")[0] for ep in entry_points(group="pytest11")}
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            del sys.modules[name]


def _serve() -> None:  # pragma: no cover - runs in the server process
    import gc
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    _forget_pytest_plugins()
    # What the server imported stays alive in every fork: out of the collector's sight, so a
    # fork's full collections walk only its own objects, as a fresh process's would.
    gc.freeze()
    _Server(launcher=sys.argv[1]).serve()


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
        self._socket = ""
        self._busy: ForkedRun | None = None
        self._launcher_dir = Path(tempfile.mkdtemp(prefix="memeval-launcher-"))
        # The launcher as an executable (it is what a run's sys.executable names).
        self._launcher = self._launcher_dir / "python"
        self._launcher.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" -S -E "{LAUNCHER}" "$@"\n', encoding="utf-8"
        )
        self._launcher.chmod(0o755)

    def _start(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, __file__, str(self._launcher)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).parent,
        )
        self._process = process
        self._socket = str(self.reply(300, ("fork server",))["socket"])
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

    def popen(
        self,
        cmdargs: tuple[str, ...],
        stdout: IO[str],
        stderr: IO[str],
        *,
        cwd: str,
        env: Mapping[str, str],
    ) -> ForkedRun:
        """Start ``cmdargs`` (``python -mpytest ...``) in ``cwd`` with ``env``, forked."""
        if self._busy is not None:  # a run left behind (its test failed before waiting)
            self._busy.kill()
            self._busy.wait()
        process = self._process if self._process is not None else self._start()
        assert process.stdin is not None
        request = {
            "args": list(cmdargs[2:]),
            "cwd": cwd,
            "env": self._launcher_environment(env),
            "stdout": stdout.name,
            "stderr": stderr.name,
        }
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        run = ForkedRun(self, cmdargs, int(self.reply(60, cmdargs)["pid"]))
        self._busy = run
        return run

    def interpreter(self, env: Mapping[str, str]) -> Interpreter:
        """The launcher, and ``env`` with what it needs to reach this server."""
        if self._process is None:
            self._start()
        return Interpreter(str(self._launcher), self._launcher_environment(env))

    def _launcher_environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` and what the launcher reads: this server's socket, the real interpreter."""
        return {**env, SOCKET_VARIABLE: self._socket, PYTHON_VARIABLE: sys.executable}

    def close(self) -> None:
        if self._process is not None:
            if self._busy is not None:
                self._busy.kill()
            self._process.kill()
            self._process.wait()
            self._process = None
        for leftover in (self._launcher, Path(self._socket)):
            with contextlib.suppress(OSError):
                leftover.unlink()
        for folder in (self._launcher_dir, Path(self._socket).parent):
            with contextlib.suppress(OSError):
                folder.rmdir()


@dataclass(frozen=True)
class Interpreter:
    """How a test starts a Python program: ``[executable, "-m", MODULE, ...]`` (or ``-c
    CODE``) with ``env`` as the process's whole environment."""

    executable: str
    env: dict[str, str]


def interpreter(env: Mapping[str, str] | None = None) -> Interpreter:
    """The Python a test starts ``-c CODE`` or ``-m MODULE`` with: the launcher, whose program
    is forked from this worker's fork server, or ``sys.executable`` where the server is off.
    ``env`` (this process's environment if None) comes back with the launcher's variables.
    A test that checks what a fresh process imports starts ``sys.executable`` itself."""
    environ = dict(os.environ if env is None else env)
    server = shared()
    return Interpreter(sys.executable, environ) if server is None else server.interpreter(environ)


def enabled() -> bool:
    """Whether runs go through the fork server: on Linux (forking a process that imported
    torch is not safe everywhere), unless it is switched off."""
    return sys.platform == "linux" and os.environ.get(OFF_SWITCH, "") in ("", "0")


_shared: ForkServer | None = None


def shared() -> ForkServer | None:
    """This process's fork server (made on first use; its process starts with the first run),
    or None where it is off."""
    global _shared
    if _shared is None and enabled():
        _shared = ForkServer()
        atexit.register(close_shared)  # where no session fixture closes it
    return _shared


def close_shared() -> None:
    """Stop this process's fork server, if it has one."""
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


if __name__ == "__main__":
    _serve()
