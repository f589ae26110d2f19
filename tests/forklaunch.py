"""An interpreter for the runs of the tests' fork server (``tests/forkserver.py``).

A forked run's ``sys.executable`` runs this file (``python -S -E forklaunch.py ARGS``), and so
does a test's own start of Python through ``forkserver.interpreter()``. For a program given
as ``-c CODE`` or ``-m MODULE`` (execnet's start of an xdist worker, ``python -u -c
BOOTSTRAP``, among them; ``-u`` the one option it understands) it hands its standard streams,
environment and directory to the fork server, whose child runs the program as that
interpreter would; then it holds none of those streams (the child's pipes close when the
child ends), waits, and ends as the child ended. Killed, the server kills the child; a
SIGTERM or SIGINT it passes on. Anything else is the real interpreter's: this process becomes
it (``exec``). Standard library only, and quick to start: it runs once per process.
"""

import contextlib
import json
import os
import signal
import socket
import sys


def program(args: list[str]) -> dict[str, object] | None:
    """What the server's child is to run for the command line ``python ARGS``, or None for
    a command line the real interpreter must run (a script, an option other than ``-u``)."""
    unbuffered = False
    while args[:1] == ["-u"]:
        unbuffered, args = True, args[1:]
    if args[:1] and args[0].startswith("-m") and len(args[0]) > 2:  # -mpytest
        args = ["-m", args[0][2:], *args[1:]]
    if len(args) >= 2 and args[0] == "-c":
        return {"code": args[1], "argv": ["-c", *args[2:]], "unbuffered": unbuffered}
    if len(args) >= 2 and args[0] == "-m":
        return {"module": args[1], "argv": [args[1], *args[2:]], "unbuffered": unbuffered}
    return None


def main(args: list[str]) -> None:
    python = os.environ.get("MEMEVAL_TEST_PYTHON", "")
    address = os.environ.get("MEMEVAL_TEST_FORK_SERVER", "")
    request = program(args)
    if request is None or not address:
        os.execv(python, [python, *args])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(address)
    request.update(cwd=os.getcwd(), env=dict(os.environ))
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
    if returncode < 0:  # ended by a signal: end by the same one
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's handler cannot be set
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    os._exit(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
