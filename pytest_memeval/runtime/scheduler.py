"""xdist scheduling by scenario: all items of one scenario go to the same worker.

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
    sends up to ``chunk`` scopes to a worker at once."""

    def __init__(self, config: pytest.Config, log: Any, id_map: IdMap, chunk: int = 1) -> None:
        super().__init__(config, log)
        self.id_map = id_map
        self.chunk = max(1, chunk)

    # -- chunks -----------------------------------------------------------------------------

    def assign_work(self, node: Any) -> None:
        """Send ``node`` the next scopes of the queue, up to ``chunk`` of them, in one message
        (xdist's version sends one scope)."""
        queue = self.work_queue
        assert queue
        # Near the end, split what is left evenly so that no worker idles while another
        # works through a full chunk.
        n = min(self.chunk, max(1, math.ceil(len(queue) / max(1, len(self.nodes)))))
        assigned_to_node = self.assigned.setdefault(node, {})
        collection = self.collections[node]
        indexes: list[int] = []
        for _ in range(min(n, len(queue))):
            scope, work_unit = queue.popitem(last=False)
            assigned_to_node[scope] = work_unit
            indexes.extend(
                collection.index(nodeid) for nodeid, completed in work_unit.items() if not completed
            )
        node.send_runtest_some(indexes)

    # -- worker crashes (a scenario that kills its worker, an OOM kill) ----------------------
    #
    # xdist's loadscope puts the crashed item back with the rest of its scope, so a scenario
    # that kills its worker would kill every replacement in turn; and it reschedules onto a
    # replacement worker that has not finished collecting (KeyError in assign_work,
    # an INTERNALERROR that ends the run). Here, as in xdist's plain ``load`` scheduling, the
    # crashed item is reported (by DSession) and not rerun; the scope's other items are, and
    # a worker is given work only once its collection is in.

    def remove_node(self, node: Any) -> str | None:
        workload: dict[str, dict[str, bool]] = self.assigned.pop(node)
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
        for scope, work_unit in workload.items():
            if not all(work_unit.values()):
                self.work_queue[scope] = work_unit
        for other in self.assigned:
            self.reschedule(other)
        return crashitem

    def reschedule(self, node: Any) -> None:
        if node not in self.collections:
            return  # a replacement still collecting: schedule() runs again when it is done
        super().reschedule(node)

    def scope_of(self, nodeid: str) -> str:
        sid = self.id_map.scenario_of(nodeid)
        if sid is not None:
            return f"memeval-scenario::{sid}"
        return nodeid.split("::", 1)[0]


class SchedulerPlugin:
    """Registered on the controller only when xdist is active and ``--dist`` is ``load``."""

    def __init__(self, id_map: IdMap, decode_path: str = "fast") -> None:
        # At configure time, before any worker starts: an xdist without the hooks the
        # scheduler builds on is one clear usage error, not a silently different schedule.
        require_scope_scheduling()
        self.id_map = id_map
        self.decode_path = decode_path

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist", None) != "load":
            return None  # the user chose a strategy explicitly; respect it
        # Decided here, after every pytest_configure (the device binder registers in one).
        chunk = chunk_size(config, self.decode_path)
        return ScenarioScheduling(config, log, self.id_map, chunk)
