"""xdist scheduling by scenario: all items of one scenario go to the same worker.

A scenario's rollout is the expensive part and is computed once per worker; sending
``test_final_query[s1]`` and ``test_turns[s1]`` to different workers would decode ``s1``
twice. This is xdist's ``loadscope`` with the scope being the scenario id.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

__all__ = ["ScenarioScheduling", "SchedulerPlugin"]


class ScenarioScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """Groups eval items (ids in ``scenario_ids``) by scenario; other items by module."""

    def __init__(self, config: pytest.Config, log: Any, scenario_ids: set[str]) -> None:
        super().__init__(config, log)
        self.scenario_ids = scenario_ids

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.endswith("]") and "[" in nodeid:
            param = nodeid[nodeid.rindex("[") + 1 : -1]
            if param in self.scenario_ids:
                return f"memeval-scenario::{param}"
        return nodeid.split("::", 1)[0]


class SchedulerPlugin:
    """Registered on the controller only when xdist is active and ``--dist`` is ``load``."""

    def __init__(self, scenario_ids: set[str]) -> None:
        self.scenario_ids = scenario_ids

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getoption("dist", None) != "load":
            return None  # the user chose a strategy explicitly; respect it
        return ScenarioScheduling(config, log, self.scenario_ids)
