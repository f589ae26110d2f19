"""A stand-in for xdist's controller loop and workers, to drive a scheduler without processes.

It follows what ``xdist.dsession.DSession`` and ``xdist.remote`` do with a scheduler (read in
pytest-xdist 3.5-3.8): workers are added and report their collections, the scheduler
schedules; a worker runs an item only while it holds at least two (it keeps its last one
until it is sent more or told to shut down, as ``WorkerInteractor`` does); after every event
the controller asks ``tests_finished`` and, when it says so, shuts every worker down; a crash
calls ``remove_node`` and brings up a replacement that collects again. A schedule that can
neither make progress nor finish is a hang, and :meth:`Simulation.run` says so instead of
looping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class FakeNode:
    """What a scheduler uses of an xdist ``WorkerController``, plus the worker's queue."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[list[int]] = []
        self.queue: deque[int] = deque()

    def send_runtest_some(self, indexes: list[int]) -> None:
        assert not self.shutting_down, f"{self.gateway.id}: work sent after shutdown"
        self.sent.append(list(indexes))
        self.queue.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True

    def runnable(self) -> bool:
        """Whether the worker would run an item now (xdist's worker loop)."""
        return len(self.queue) >= 2 or (self.shutting_down and bool(self.queue))

    def __repr__(self) -> str:
        return f"FakeNode({self.gateway.id})"


class FakeConfig:
    """The two things xdist's loadscope reads from a pytest config: the ``--tx`` specs and
    ``--loadscope-reorder``."""

    def __init__(self, workers: int) -> None:
        self.option = type("Option", (), {"loadscopereorder": False})()
        self._tx = [f"{workers}*popen"]

    def getvalue(self, name: str) -> Any:
        assert name == "tx"
        return self._tx


class Hang(AssertionError):
    """The schedule can make no progress and is not finished: a real run would wait forever."""


@dataclass
class Simulation:
    """Drive ``scheduler`` over ``collection`` with ``workers`` workers.

    ``crash(event_number, node) -> bool`` decides, before each event, whether ``node`` dies
    there instead of running its item.
    """

    scheduler: Any
    collection: Sequence[str]
    workers: int
    crash: Callable[[int, FakeNode], bool] = lambda _n, _node: False
    ran: list[str] = field(default_factory=list)
    crashed: list[str] = field(default_factory=list)
    shut_down_all: bool = False
    events: int = 0

    def __post_init__(self) -> None:
        self.nodes: list[FakeNode] = []
        #: every worker the run had, crashed and replacements included, in start order
        self.started: list[FakeNode] = []
        self._names = 0
        for _ in range(self.workers):
            self._start()
        for node in list(self.nodes):
            self._collect(node)

    def _start(self) -> FakeNode:
        node = FakeNode(f"gw{self._names}")
        self._names += 1
        self.nodes.append(node)
        self.started.append(node)
        self.scheduler.add_node(node)
        return node

    def _collect(self, node: FakeNode) -> None:
        self.scheduler.add_node_collection(node, list(self.collection))
        if self.scheduler.collection_is_completed:
            self.scheduler.schedule()

    def _after_event(self) -> None:
        self.events += 1
        if self.scheduler.tests_finished and not self.shut_down_all:
            self.shut_down_all = True
            for node in self.scheduler.nodes:
                node.shutdown()

    def run(self, max_events: int = 10_000_000) -> None:
        """Run to the end; raise :class:`Hang` where a real run would wait forever."""
        while self.events < max_events:
            busy = [n for n in self.nodes if n.runnable()]
            if not busy:
                if all(n.shutting_down and not n.queue for n in self.nodes):
                    for node in self.nodes:  # each worker's session ends
                        # (xdist's worker_workerfinished: only a node the scheduler still
                        # lists; one it shut down unused at the start is not)
                        if node in self.scheduler.nodes:
                            self.scheduler.remove_node(node)
                    self.nodes.clear()
                    return
                holding = {n.gateway.id: list(n.queue) for n in self.nodes}
                raise Hang(f"no worker can run an item and none is told to stop: {holding}")
            node = busy[self.events % len(busy)]
            if self.crash(self.events, node):
                self._crash(node)
            else:
                index = node.queue.popleft()
                self.ran.append(self.collection[index])
                self.scheduler.mark_test_complete(node, index)
            self._after_event()
        raise Hang(f"still running after {max_events} events")

    def _crash(self, node: FakeNode) -> None:
        self.nodes.remove(node)
        item = self.scheduler.remove_node(node)
        if item is not None:
            self.crashed.append(item)
        self.shut_down_all = False  # DSession: a replacement comes up
        replacement = self._start()
        self._collect(replacement)
