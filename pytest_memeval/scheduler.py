"""xdist scheduling by scenario: all items of one scenario go to the same worker.

A scenario's rollout is the expensive part and is computed once per worker; sending
``test_final_query[s1]`` and ``test_turns[s1]`` to different workers would decode ``s1``
twice. This is xdist's ``loadscope`` with the scope being the scenario id.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from .ids import IdMap

__all__ = ["ScenarioScheduling", "SchedulerPlugin"]


class ScenarioScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """Groups eval items (scenarios of ``id_map``) by scenario; other items by module."""

    def __init__(self, config: pytest.Config, log: Any, id_map: IdMap) -> None:
        super().__init__(config, log)
        self.id_map = id_map

    # -- worker crashes (a scenario that kills its worker, an OOM kill) ----------------------
    #
    # xdist's loadscope puts the crashed item back with the rest of its scope, so a scenario
    # that kills its worker would kill every replacement in turn; and it reschedules onto a
    # replacement worker that has not finished collecting (KeyError in _assign_work_unit,
    # an INTERNALERROR that ends the run). Here, as in xdist's plain ``load`` scheduling, the
    # crashed item is reported (by DSession) and not rerun; the scope's other items are, and
    # a worker is given work only once its collection is in.

    def remove_node(self, node: Any) -> str | None:
        workload: dict[str, dict[str, bool]] = self.assigned_work.pop(node)
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
                self.workqueue[scope] = work_unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node: Any) -> None:
        if node not in self.registered_collections:
            return  # a replacement still collecting: schedule() runs again when it is done
        super()._reschedule(node)

    def _split_scope(self, nodeid: str) -> str:
        sid = self.id_map.scenario_of(nodeid)
        if sid is not None:
            return f"memeval-scenario::{sid}"
        return nodeid.split("::", 1)[0]


class SchedulerPlugin:
    """Registered on the controller only when xdist is active and ``--dist`` is ``load``."""

    def __init__(self, id_map: IdMap) -> None:
        self.id_map = id_map

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist", None) != "load":
            return None  # the user chose a strategy explicitly; respect it
        return ScenarioScheduling(config, log, self.id_map)
