"""xdist scheduling by scenario: all items of one scenario go to the same worker.

A closed-loop run schedules its episodes the same way (one item an episode), in chunks of the
episodes a worker steps together (``decode.fast.EPISODES_TOGETHER``): xdist's ``load``
queues about two items a worker, so its workers would step their episodes in pairs.

A scenario's rollout is the expensive part and is computed once per worker; sending
``test_final_query[s1]`` and ``test_turns[s1]`` to different workers would decode ``s1``
twice. This is xdist's ``loadscope`` with the scope being the scenario id.

Scopes are handed out in chunks: with the fast decode path a worker is sent the scenarios of
one forward batch at once (``chunk``, the fast path's batch size), so that its prefetch (which
decodes only what is already queued on it) sees a full batch. A worker gets its next chunk
when it is down to its last scenario, as xdist's loadscope tops a worker up at two pending
items; near the end of the queue chunks shrink so that every worker still gets work.

xdist has no public API for any of this: the scheduler subclasses
:class:`pytest_memeval.compat.xdist.ScopeScheduling`, the adapter that gives loadscope's
private hooks and state public names, so that no xdist internal is named here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from pytest_memeval.compat.xdist import ScopeScheduling, require_scope_scheduling
from pytest_memeval.core.ids import IdMap
from pytest_memeval.decode.fast import DEFAULT_ACCELERATOR_BATCH_SIZE, DEFAULT_BATCH_SIZES
from pytest_memeval.runtime.device_binding import BINDER_NAME

__all__ = ["ScenarioScheduling", "SchedulerPlugin", "chunk_size"]


def chunk_size(config: pytest.Config, decode_path: str) -> int:
    """Scenarios per chunk: the fast path's default batch size for the workers' devices
    (GPUs when the device binder lists any), 1 for the other decode paths (they decode one
    scenario at a time, and single scopes balance the load best)."""
    if decode_path != "fast":
        return 1
    binder = config.pluginmanager.get_plugin(BINDER_NAME)
    source = getattr(binder, "source", None)
    if source is not None and not source.on_cpu:
        return DEFAULT_ACCELERATOR_BATCH_SIZE
    return DEFAULT_BATCH_SIZES["cpu"]


class ScenarioScheduling(ScopeScheduling):
    """Groups eval items (scenarios of ``id_map``) by scenario; other items by module; and
    sends up to ``chunk`` scopes to a worker at once.

    The controller's work per finished item is constant, whatever the collection's size:
    a node id's position is looked up in a dict (xdist's loadscope searches the collection
    list for it), each worker's count of unfinished items is kept as a number per scope, and
    a scope leaves its worker's workload as soon as its last item finishes, so that xdist's
    own checks after every event (``tests_finished``, ``has_pending``), which walk every
    worker's workload, see only the scopes still in flight rather than all assigned so far.
    """

    def __init__(self, config: pytest.Config, log: Any, id_map: IdMap, chunk: int = 1) -> None:
        super().__init__(config, log)
        self.id_map = id_map
        self.chunk = max(1, chunk)
        #: node id -> its index in the collection (every registered collection is the same
        #: list: xdist refuses a worker whose collection differs)
        self._positions: dict[str, int] | None = None
        #: per worker node, per scope in flight there: its items not finished yet
        self._unfinished: dict[Any, dict[str, int]] = {}

    # -- counts ---------------------------------------------------------------------------

    def pending_on(self, node: Any) -> int:
        """Items sent to ``node`` and not finished (its scopes in flight: at most a chunk
        and the scopes a crash handed back)."""
        return sum(self._unfinished.get(node, {}).values())

    def in_flight(self) -> dict[str, list[str]]:
        """Per worker (its xdist id), the node ids sent to it and not finished."""
        return {
            str(node.gateway.id): [
                nodeid for unit in workload.values() for nodeid, done in unit.items() if not done
            ]
            for node, workload in list(self.assigned.items())
        }

    def _position(self, node: Any, nodeid: str) -> int:
        if self._positions is None:
            self._positions = {nid: i for i, nid in enumerate(self.collections[node])}
        return self._positions[nodeid]

    # -- chunks -----------------------------------------------------------------------------

    def assign_work(self, node: Any) -> None:
        """Send ``node`` the next scopes of the queue in one message: up to ``chunk`` of them
        (xdist's version sends one scope), and always enough that the node holds two items or
        the queue is empty.

        The second rule is what keeps a run from hanging: an xdist worker runs an item only
        once it knows the next one (or is told to shut down), so a worker left holding a
        single item while scopes wait in the queue would wait for a message the scheduler
        sends only when it finishes an item. A scope a crash handed back can hold one item.
        """
        queue = self.work_queue
        if not queue:
            # Scopes of one item (episodes, a -k that keeps one check of each scenario) and
            # fewer of them than two per worker: an earlier node took the last ones. This node
            # is shut down with the rest when the initial distribution ends.
            return
        # Near the end, split what is left evenly so that no worker idles while another
        # works through a full chunk.
        n = min(self.chunk, max(1, math.ceil(len(queue) / max(1, len(self.nodes)))))
        assigned_to_node = self.assigned.setdefault(node, {})
        unfinished = self._unfinished.setdefault(node, {})
        held = sum(unfinished.values())
        indexes: list[int] = []
        while queue and (n > 0 or held < 2):
            scope, work_unit = queue.popitem(last=False)
            todo = [self._position(node, nodeid) for nodeid, done in work_unit.items() if not done]
            assigned_to_node[scope] = work_unit
            unfinished[scope] = len(todo)
            indexes.extend(todo)
            held += len(todo)
            n -= 1
        node.send_runtest_some(indexes)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        """Item ``item_index`` finished on ``node``: count it, drop its scope from the node's
        workload once the scope is done, and top the node up if it runs low."""
        nodeid = self.collections[node][item_index]
        scope = self.scope_of(nodeid)
        work_unit = self.assigned[node].get(scope)
        if work_unit is not None and not work_unit[nodeid]:
            work_unit[nodeid] = True
            self._finish_one(node, scope)
        self.reschedule(node)

    def _finish_one(self, node: Any, scope: str) -> None:
        unfinished = self._unfinished[node]
        unfinished[scope] -= 1
        if unfinished[scope] <= 0:
            del unfinished[scope]
            del self.assigned[node][scope]

    def reschedule(self, node: Any) -> None:
        """Top ``node`` up with the next chunk once it holds at most two unfinished items
        (xdist's loadscope threshold); shut it down when the queue is empty."""
        if node not in self.collections:
            return  # a replacement still collecting: schedule() runs again when it is done
        if node.shutting_down:
            return
        if not self.work_queue:
            node.shutdown()
            return
        if self.pending_on(node) > 2:
            return
        self.assign_work(node)

    # -- worker crashes (a scenario that kills its worker, an OOM kill) ----------------------
    #
    # xdist's loadscope puts the crashed item back with the rest of its scope, so a scenario
    # that kills its worker would kill every replacement in turn; and it reschedules onto a
    # replacement worker that has not finished collecting (KeyError in assign_work,
    # an INTERNALERROR that ends the run). Here, as in xdist's plain ``load`` scheduling, the
    # crashed item is reported (by DSession) and not rerun; the scope's other items are (the
    # scenario's record then comes from them), a worker is given work only once its
    # collection is in, and never only one item while others wait (assign_work).

    def remove_node(self, node: Any) -> str | None:
        workload: dict[str, dict[str, bool]] = self.assigned.pop(node)
        self._unfinished.pop(node, None)
        crashitem: str | None = None
        for work_unit in workload.values():
            for nodeid, completed in work_unit.items():
                if not completed:
                    crashitem = nodeid
                    work_unit[nodeid] = True  # reported as the crash, not run again
                    break
            if crashitem is not None:
                break
        if crashitem is None:
            return None
        # Back to the front of the queue: the next worker with room continues them.
        for scope, work_unit in reversed(workload.items()):
            if not all(work_unit.values()):
                self.work_queue[scope] = work_unit
                self.work_queue.move_to_end(scope, last=False)
        for other in self.assigned:
            self.reschedule(other)
        return crashitem

    def scope_of(self, nodeid: str) -> str:
        sid = self.id_map.scenario_of(nodeid)
        if sid is not None:
            return f"memeval-scenario::{sid}"
        return nodeid.split("::", 1)[0]


class SchedulerPlugin:
    """Registered on the controller only when xdist is active and ``--dist`` is ``load``."""

    def __init__(self, id_map: IdMap, decode_path: str = "fast", chunk: int | None = None) -> None:
        # At configure time, before any worker starts: an xdist without the hooks the
        # scheduler builds on is one clear usage error, not a silently different schedule.
        require_scope_scheduling()
        self.id_map = id_map
        self.decode_path = decode_path
        #: scopes per chunk (``None``: :func:`chunk_size`'s, the scenario runs'; a closed-loop
        #: run gives the episodes a worker steps together)
        self.chunk = chunk
        #: the run's scheduler, once xdist asked for it (None with another ``--dist``)
        self.scheduler: ScenarioScheduling | None = None

    def in_flight(self) -> dict[str, list[str]]:
        """Per worker, the items it holds (empty before scheduling or with another
        ``--dist``)."""
        return self.scheduler.in_flight() if self.scheduler is not None else {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist", None) != "load":
            return None  # the user chose a strategy explicitly; respect it
        # Decided here, after every pytest_configure (the device binder registers in one).
        chunk = self.chunk if self.chunk is not None else chunk_size(config, self.decode_path)
        self.scheduler = ScenarioScheduling(config, log, self.id_map, chunk)
        return self.scheduler
