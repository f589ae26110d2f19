"""The test suite's shape: markers by folder, shared setup in helper modules, not test modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ..conftest import REPO

TESTS = REPO / "tests"


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports (and every name imported from one: it may be a module),
    relative ones spelled with their leading dots."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            sep = "." if node.module else ""
            found += [base] + [base + sep + alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_this_test_is_marked_unit_by_its_folder(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None


def test_the_markers_are_registered(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert {"unit", "integration", "slow"} <= registered
    assert "--strict-markers" in pytestconfig.getini("addopts")  # a misspelt marker fails


def test_no_test_module_imports_another() -> None:
    """Shared setup lives in helper modules (conftest.py, runfactory.py, pages.py, ...)."""
    modules = sorted(TESTS.rglob("test_*.py"))
    assert len(modules) > 20, "the walk found the test modules"
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in modules
        for name in _imported_modules(path)
        if name.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert offenders == []


def test_the_check_sees_a_test_module_import(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text(
        "from .test_merge import IDS\nfrom ..unit import test_report\nimport json\n", "utf-8"
    )
    assert _imported_modules(module) == [
        ".test_merge",
        ".test_merge.IDS",
        "..unit",
        "..unit.test_report",
        "json",
    ]
