"""The scenario scheduler against every moment a worker can die, and at scale, without xdist.

:mod:`tests.xdistsim` plays xdist's controller loop and workers around the real
:class:`~pytest_memeval.runtime.scheduler.ScenarioScheduling`: a crash before any event of a
run, with two and three workers and chunks of one and eight scopes, must end the run (never a
hang) with every item run or reported as the crash exactly once. The end-to-end kills, with
real worker processes and the model, are in ``tests/integration/test_worker_faults.py``.

The scaling check counts, rather than times, the controller's work: Python line events in
the scheduler (and in xdist's code it calls) per item, at two collection sizes.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from pytest_memeval.core.ids import IdMap
from pytest_memeval.runtime.scheduler import ScenarioScheduling

from ..xdistsim import FakeConfig, FakeNode, Simulation


class QuietLog:
    """xdist's ``Producer`` stand-in: the scheduler logs through ``log.loadscopesched``."""

    def __getattr__(self, name: str) -> QuietLog:
        return self

    def __call__(self, *args: Any) -> None:
        pass


def eval_collection(n: int) -> tuple[list[str], list[str]]:
    ids = [f"s{k:05d}" for k in range(n)]
    items = [f"test_eval.py::test_{fn}[{sid}]" for sid in ids for fn in ("final_query", "turns")]
    return items, ids


def simulation(
    n: int, workers: int, chunk: int, crash: Callable[[int, FakeNode], bool] | None = None
) -> Simulation:
    items, ids = eval_collection(n)
    sched = ScenarioScheduling(FakeConfig(workers), QuietLog(), IdMap(ids), chunk)
    if crash is None:
        return Simulation(sched, items, workers)
    return Simulation(sched, items, workers, crash)


def crash_once(at: int, victim: str) -> Callable[[int, FakeNode], bool]:
    """Kill worker ``victim`` at its first event from event number ``at`` on."""
    done: list[bool] = []

    def crash(event: int, node: FakeNode) -> bool:
        if not done and event >= at and node.gateway.id == victim:
            done.append(True)
            return True
        return False

    return crash


def assert_each_item_once(sim: Simulation) -> None:
    seen = Counter(sim.ran + sim.crashed)
    assert set(seen) == set(sim.collection), set(sim.collection) - set(seen)
    assert max(seen.values()) == 1, [item for item, k in seen.items() if k > 1]


@pytest.mark.parametrize("episodes", [1, 2, 3, 5, 20])
@pytest.mark.parametrize(("workers", "chunk"), [(2, 1), (2, 8), (3, 8)])
def test_one_item_scopes_fewer_than_the_workers_hold_end_the_run(
    episodes: int, workers: int, chunk: int
) -> None:
    """A closed-loop run's scopes are one item each (one episode); with fewer than two per
    worker, the first workers take them all: the others get nothing and stop, and every
    episode runs once (an empty queue used to fail an assertion, an INTERNALERROR)."""
    ids = [f"twc-{k}" for k in range(episodes)]
    items = [f"memeval::test_episode[{sid}]" for sid in ids]
    sched = ScenarioScheduling(FakeConfig(workers), QuietLog(), IdMap(ids), chunk)
    sim = Simulation(sched, items, workers)
    sim.run()
    assert sorted(sim.ran) == sorted(items) and not sim.crashed


@pytest.mark.parametrize(("workers", "chunk"), [(2, 1), (2, 8), (3, 8), (3, 1)])
def test_a_crash_at_any_moment_ends_the_run(workers: int, chunk: int) -> None:
    n = 20
    for at in range(2 * n + 2):
        for victim in range(workers):
            sim = simulation(n, workers, chunk, crash_once(at, f"gw{victim}"))
            sim.run()  # raises Hang where a real run would wait forever
            assert_each_item_once(sim)


def test_the_crash_that_hung_a_run() -> None:
    # gw1 dies holding a scenario it had started and one it had not; gw0 had already been
    # told to shut down (the queue was empty). The replacement gw2 was sent the started
    # scenario's one item left, and held it waiting for a next one, while the other
    # scenario waited in the queue for a message that never came: both workers idle, the
    # controller waiting, for ever. Now gw2 is sent both scenarios at once.
    sim = simulation(20, 2, 1, crash_once(32, "gw1"))
    sim.run()
    assert_each_item_once(sim)
    assert sim.crashed == ["test_eval.py::test_final_query[s00017]"]
    replacement = sim.started[-1]
    assert replacement.gateway.id == "gw2"
    assert [len(message) for message in replacement.sent] == [3]


def test_two_workers_and_a_replacement_killed_in_one_run() -> None:
    kills = {3: "gw0", 9: "gw1", 15: "gw2"}

    def crash(event: int, node: FakeNode) -> bool:
        victim = next((v for at, v in kills.items() if event >= at), None)
        if victim == node.gateway.id:
            kills.pop(next(at for at, v in kills.items() if v == victim))
            return True
        return False

    sim = simulation(12, 2, 8, crash)
    sim.run()
    assert_each_item_once(sim)
    assert len(sim.crashed) == 3


def test_a_crash_after_the_others_were_shut_down_leaves_the_work_to_the_replacement() -> None:
    # The last scopes are in flight on gw1 when it dies; gw0 has nothing left and was told
    # to shut down. The crash's scopes go back to the queue and only the replacement can run
    # them: it does, and the run ends.
    sim = simulation(4, 2, 1, crash_once(5, "gw1"))
    sim.run()
    assert_each_item_once(sim)
    gw0, gw1, gw2 = sim.started
    assert gw0.shutting_down and gw2.gateway.id == "gw2"
    handed_back = {i for m in gw1.sent for i in m} - {sim.collection.index(sim.crashed[0])}
    ran_before = {sim.collection.index(item) for item in sim.ran} - {i for m in gw2.sent for i in m}
    assert {i for m in gw2.sent for i in m} == handed_back - ran_before


class LineCounter:
    """Counts Python line events (the interpreter's unit of work a loop repeats) and calls
    of ``list.index`` (a C loop over the collection) while it is installed."""

    def __init__(self) -> None:
        self.lines = 0
        self.index_calls = 0

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._trace

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "index":
            self.index_calls += 1

    def __enter__(self) -> LineCounter:
        sys.settrace(self._trace)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        sys.setprofile(None)


def work_per_item(n: int) -> tuple[float, int]:
    sim = simulation(n, 2, 8)
    with LineCounter() as counter:
        sim.run()
    assert_each_item_once(sim)
    return counter.lines / len(sim.collection), counter.index_calls


def test_controller_work_per_item_does_not_grow_with_the_collection() -> None:
    small, small_index = work_per_item(400)
    large, large_index = work_per_item(3200)
    # Linear: the same work per item at 8x the items (a quadratic scheduler does ~8x more
    # per item here: xdist's loadscope walks every scope ever assigned after every event).
    assert large == pytest.approx(small, rel=0.05), (small, large)
    # No search through the collection for an item's position.
    assert small_index == large_index == 0
