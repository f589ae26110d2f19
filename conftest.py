"""Root conftest: intentionally thin. The plugin registers itself via its pytest11 entry point.

An evaluation run (``pytest --ckpt NAME``) collects the benchmark's contracts, not the plugin's
own test suite under ``tests/``, unless a path under ``tests`` is named on the command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_memeval.runtime.state import workerinput

_TESTS = Path(__file__).parent / "tests"


def _command_line(config: pytest.Config) -> list[str]:
    # xdist workers get the controller's expanded testpaths as their args; the user's own
    # command line travels in workerinput["mainargv"].
    wi = workerinput(config)
    if wi is not None:
        return [str(a) for a in wi.get("mainargv", [])[1:]]
    return list(config.invocation_params.args)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Initial arguments (testpaths) are never ignored, so judge what lies inside tests/.
    inside = collection_path.is_relative_to(_TESTS) and collection_path != _TESTS
    if not inside or not config.getoption("memeval_ckpt", None):
        return None
    here = config.invocation_params.dir
    named = any(
        (here / arg.split("::")[0]).resolve().is_relative_to(_TESTS)
        for arg in _command_line(config)
        if not arg.startswith("-")
    )
    return None if named else True
