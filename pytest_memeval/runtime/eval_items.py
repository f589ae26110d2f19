"""Which scenario a collected pytest item evaluates, and when the plugin provides the items.

Kept in runtime/ rather than core/ids.py: it reads a ``pytest.Item`` (its ``callspec``),
and core/ holds plain data only. The node-id parsing that needs no item stays in
:mod:`pytest_memeval.core.ids` (``IdMap.scenario_of``, ``split_item_name``).

The standard eval items (:mod:`pytest_memeval.evaluation`) come from a test module that
imports them, as ``contracts/test_eval.py`` does, or, where no collected module provides any
eval item, from the plugin itself (plugin.py): one module named :data:`PROVIDED` whose items
are ``memeval::test_final_query[<id>]`` and ``memeval::test_turns[<id>]``. The plugin adds
them only to a run that collects the whole project (:func:`covers_project`): ``pytest
--ckpt NAME`` with no path, or with the project's root; ``pytest --ckpt NAME tests/unit``
runs what it names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "NO_PROFILE_ID",
    "PROVIDED",
    "SCENARIO_FIXTURE",
    "covers_project",
    "eval_item_count",
    "scenario_param",
]

#: The name (and node id) of the module the plugin collects its own eval items in.
PROVIDED = "memeval"
#: The fixture the scenario items are parametrized over (``test_final_query``, ``test_turns``).
SCENARIO_FIXTURE = "memeval_scenario"
#: The one (skipped) param id of a scenario item in a run without a scenario profile.
NO_PROFILE_ID = "no-ckpt"


def scenario_param(item: pytest.Item) -> str | None:
    """The scenario id an eval item is parametrized with, or ``None`` for other items."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get(SCENARIO_FIXTURE)
    return value if isinstance(value, str) else None


def eval_item_count(items: Sequence[pytest.Item]) -> int:
    """How many of ``items`` are eval items (parametrized over the scenarios)."""
    return sum(1 for item in items if scenario_param(item) is not None)


def covers_project(config: pytest.Config) -> bool:
    """Whether this run collects the whole project: no path on the command line (pytest
    collects ``testpaths`` or the directory it was started in), or a path that is the
    rootdir or a folder above it. Only then does the plugin provide the eval items."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return True
    root = config.rootpath.resolve()
    start = config.invocation_params.dir
    for arg in config.args:
        path = (start / arg.split("::", 1)[0]).resolve()
        if path == root or path in root.parents:
            return True
    return False
