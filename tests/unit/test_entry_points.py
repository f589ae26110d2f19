"""Every entry point pyproject.toml declares resolves to something that exists.

A module moved in a redesign leaves a console script or the ``pytest11`` plugin pointing at
nothing, and nothing else fails until a user's ``pip install`` (``memeval: ImportError``) or
pytest start (the plugin silently missing). This reads the declarations and imports each.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _entry_points() -> list[tuple[str, str]]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    found = [(f"scripts:{name}", target) for name, target in project["scripts"].items()]
    for group, entries in project["entry-points"].items():
        found += [(f"{group}:{name}", target) for name, target in entries.items()]
    return found


def test_pyproject_declares_the_console_script_and_the_pytest_plugin() -> None:
    names = {name for name, _ in _entry_points()}
    assert {"scripts:memeval", "pytest11:memeval"} <= names


@pytest.mark.parametrize(("name", "target"), _entry_points())
def test_entry_point_target_imports_and_has_its_attribute(name: str, target: str) -> None:
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name.strip())
    if attribute:
        obj = module
        for part in attribute.strip().split("."):
            assert hasattr(obj, part), f"{name} = {target!r}: {obj!r} has no {part!r}"
            obj = getattr(obj, part)
        assert callable(obj), f"{name} = {target!r} is not callable"


def test_memeval_imports_only_the_module_of_the_command_that_runs(tmp_path: Path) -> None:
    # A fresh interpreter: this test process has imported every command module already.
    code = (
        "import sys; from pytest_memeval.tools.cli import COMMANDS, main\n"
        f"main(['recount', {str(tmp_path)!r}])\n"
        "print(sorted(m for m, _ in COMMANDS.values() if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(PYPROJECT.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "['pytest_memeval.tools.recount_command']"
    assert "memeval recount: FAIL" in done.stderr
