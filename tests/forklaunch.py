"""An interpreter for the runs of the tests' fork server (``tests/forkserver.py``).

A forked run's ``sys.executable`` runs this file (``python -S -E forklaunch.py ARGS``). For
execnet's start of an xdist worker (``-u -c BOOTSTRAP``) it hands its standard streams,
environment and directory to the fork server, whose child runs the bootstrap; then it holds
none of those streams (the worker's pipes close when the worker ends), waits, and ends as
the worker ended. Killed, the server kills the worker; a SIGTERM or SIGINT it passes on.
Anything else is the real interpreter's: this process becomes it (``exec``). Standard
library only, and quick to start: it runs once per worker.
"""

import contextlib
import json
import os
import signal
import socket
import sys

BOOTSTRAP = "import sys;exec(eval(sys.stdin.readline()))"


def main(args: list[str]) -> None:
    python = os.environ.get("MEMEVAL_TEST_PYTHON", "")
    address = os.environ.get("MEMEVAL_TEST_FORK_SERVER", "")
    is_worker = len(args) >= 2 and args[-2:] == ["-c", BOOTSTRAP] and set(args[:-2]) <= {"-u"}
    if not (is_worker and address):
        os.execv(python, [python, *args])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(address)
    request = {"code": BOOTSTRAP, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
    replies = server.makefile("r", encoding="utf-8")
    pid = int(json.loads(replies.readline())["pid"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def pass_on(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    line = replies.readline()
    returncode = int(json.loads(line)["returncode"]) if line else 1
    if returncode < 0:
        signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    os._exit(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
