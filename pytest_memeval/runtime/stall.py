"""A run that stops moving is stopped: ``--memeval-stall-timeout SECONDS``.

A worker that dies is seen by xdist at once (its process ends). A worker that stops without
dying is not: a process stopped by a signal, a CUDA call that never returns, a file system
that blocks, a lock whose holder hangs. Its items stay outstanding, the controller waits for
them, and the run would wait for ever, eating a CI job's or a cluster allocation's whole time.

The controller notes every event a worker sends (node up or down, collection, each item's
start, report and finish). If none arrives for the stall timeout while items are
outstanding (sent to a worker and not finished; without xdist, an item running), a watch
thread interrupts the controller's main thread; the loop's wrapper turns
that into one message naming each worker and the items it holds, and ends the session with
``pytest.exit`` (exit status 2, interrupted). The session's end still runs: the controller
writes the scenarios evaluated so far as an unfinished run (``complete: false``, the others
``missing``), which ``--memeval-resume`` continues, and xdist tears the workers down (a
stopped one is killed after its grace period).

The default is generous (an hour): the first load of a 70B model from a network file system
can take tens of minutes, and when a replacement worker loads it mid-run, the other workers
may hold their last items that long with no event. Start-up itself (before any item is
outstanding) is not timed. ``0`` turns the watch off.
Without xdist the same watch covers the one process, as far as Python can be interrupted:
a call stuck inside native code is interrupted only when it returns. A closed-loop run
registers the same watch (runtime/episodes/controller.py): its items are episodes.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest

from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.runtime.progress import seconds_setting

__all__ = ["DEFAULT_STALL_TIMEOUT_S", "StallWatch", "describe_stall", "stall_timeout_from"]

DEFAULT_STALL_TIMEOUT_S = 3600.0

#: What a worker holds: worker id -> node ids of the items sent to it and not finished.
Holdings = dict[str, list[str]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-stall-timeout",
        dest="memeval_stall_timeout",
        metavar="SECONDS",
        default=None,
        help="stop the run, written as unfinished (resumable), when no worker has reported "
        "anything for SECONDS while items are outstanding (default: memeval_stall_timeout "
        f"ini, {DEFAULT_STALL_TIMEOUT_S:g}; 0 turns it off)",
    )
    parser.addini(
        "memeval_stall_timeout",
        "seconds without any worker event, items outstanding, before the run is stopped (0: never)",
        default=str(DEFAULT_STALL_TIMEOUT_S),
    )


def stall_timeout_from(config: pytest.Config) -> float:
    """The stall timeout in seconds (0: off); a bad value is a usage error."""
    return seconds_setting(
        config, "memeval_stall_timeout", "--memeval-stall-timeout", "memeval_stall_timeout"
    )


def _worker_id(node: Any) -> str:
    return str(getattr(getattr(node, "gateway", None), "id", node))


def describe_stall(
    timeout: float, holdings: Holdings, starting: list[str], journal: str | None
) -> str:
    """The one message a stopped run prints: who holds what (or is still starting: collecting
    and loading the model), and where the results are."""
    parts = [
        f"{worker} {'has' if ' ' in worker else 'holds'} {shown_ids(items)}"
        for worker, items in sorted(holdings.items())
        if items
    ]
    if starting:
        parts.append(
            f"{', '.join(starting)} still starting (collecting, loading the model) since its "
            "last event"
        )
    held = "; ".join(parts)
    # (the items are scenarios' checks or, in a closed-loop run, episodes)
    kept = (
        f"the results so far are kept in {journal}: rerun with --memeval-resume to "
        "evaluate only the others"
        if journal
        else "nothing had finished; nothing was evaluated"
    )
    return (
        f"pytest-memeval: no worker has reported anything for {timeout:g} s while items are "
        f"outstanding (--memeval-stall-timeout): {held or 'no worker holds an item'}. "
        f"The run was stopped; {kept}."
    )


class StallWatch:
    """Controller side: stops the run when no worker event arrived for ``timeout`` seconds.

    ``holdings()`` says what each worker holds (the scenario scheduler's view under xdist);
    ``pending()`` whether xdist's scheduler, whichever ``--dist`` chose it, has items not
    finished (the one signal when another scheduler than ours runs); ``journal()`` where the
    evaluated scenarios are, if any.
    """

    def __init__(
        self,
        timeout: float,
        holdings: Callable[[], Holdings],
        journal: Callable[[], str | None],
        pending: Callable[[], bool] = lambda: False,
    ) -> None:
        self.timeout = timeout
        self.holdings = holdings
        self.journal = journal
        self.pending = pending
        self.last_event = time.monotonic()
        #: the message, once the watch fired
        self.fired: str | None = None
        self._running: set[str] = set()  # without xdist: the item this process runs
        self._starting: dict[str, None] = {}  # workers up and not done collecting, in order
        self._previous: Any = signal.SIG_DFL  # SIGINT's handler before the loop
        self._done = threading.Event()

    # -- events: anything a worker says ---------------------------------------------------

    def touch(self) -> None:
        self.last_event = time.monotonic()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._running.add(nodeid)
        self.touch()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._running.discard(nodeid)
        self.touch()

    def pytest_runtest_logreport(self) -> None:
        self.touch()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodeready(self, node: Any) -> None:
        self._starting[_worker_id(node)] = None
        self.touch()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any) -> None:
        self._starting.pop(_worker_id(node), None)
        self.touch()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any) -> None:
        self._starting.pop(_worker_id(node), None)
        self.touch()

    def held_items(self) -> Holdings:
        """What each worker holds; without xdist, the item this process is running."""
        held = {worker: items for worker, items in self.holdings().items() if items}
        if held or self._starting:
            return held
        if self.pending():
            # Another --dist than the scenario scheduler: xdist knows, but does not say, who
            # holds what; the items started and not finished are what the events showed.
            return {"xdist's scheduler": sorted(self._running) or ["items sent, none started"]}
        return {"this process": sorted(self._running)}

    def starting(self) -> list[str]:
        """Workers that are up and have not reported their collection (loading the model)."""
        return list(self._starting)

    # -- the watch ----------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        if self.timeout <= 0:
            return (yield)
        try:
            # Our own SIGINT handler for the loop: a process started in the background by a
            # non-interactive shell (a CI job's `cmd &`) inherits SIGINT ignored, and Python
            # then installs no handler; the watch's signal would do nothing.
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread (pytest embedded): no watch
            return (yield)
        self.touch()
        thread = threading.Thread(target=self._watch, name="memeval-stall-watch", daemon=True)
        thread.start()
        try:
            return (yield)
        except KeyboardInterrupt:
            if self.fired is None:
                raise  # a real Ctrl-C
            pytest.exit(self.fired, returncode=pytest.ExitCode.INTERRUPTED)
        finally:
            self._done.set()
            thread.join(timeout=5)
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """The watch fired: a KeyboardInterrupt in the main thread, which the loop's wrapper
        turns into the stall message. Otherwise a real Ctrl-C, handled as it was before the
        loop: by the handler that was there, ignored if SIGINT was ignored."""
        if self.fired is not None:
            raise KeyboardInterrupt
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def _watch(self) -> None:
        while not self._done.wait(timeout=min(1.0, self.timeout)):
            if not any(self.held_items().values()):
                # Nothing outstanding (workers starting: collecting, loading the model, or
                # between items): the clock runs only while a worker holds items.
                self.touch()
                continue
            if time.monotonic() - self.last_event < self.timeout:
                continue
            if self._done.is_set():
                return  # the loop ended meanwhile
            self.fired = describe_stall(
                self.timeout, self.held_items(), self.starting(), self.journal()
            )
            # The controller's main thread waits on xdist's event queue (in two-second
            # polls) or runs an item: SIGINT's KeyboardInterrupt reaches it there (Python
            # runs signal handlers in the main thread), and the wrapper above turns it into
            # this message and an orderly end of the session. Only this process gets it.
            signal.raise_signal(signal.SIGINT)
            return
