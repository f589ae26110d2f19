"""Every entry point pyproject.toml declares resolves to something that exists.

A module moved in a redesign leaves a console script or the ``pytest11`` plugin pointing at
nothing, and nothing else fails until a user's ``pip install`` (``memeval: ImportError``) or
pytest start (the plugin silently missing). This reads the declarations and imports each.
"""

from __future__ import annotations

import importlib
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
