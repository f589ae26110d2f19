"""``.ci/same_versions.py``: the newest-releases step of ``.ci/run`` is skipped only when it
would run on exactly what the main suite ran on; any other release, a missing distribution
or another Python means it runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parents[2] / ".ci" / "same_versions.py"


@pytest.fixture(scope="module")
def same_versions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("same_versions", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(python: str = "3.11.9", **dists: str) -> dict[str, object]:
    return {"python": python, "dists": dict(dists)}


def test_the_same_releases_are_nothing_new(same_versions: ModuleType) -> None:
    tested = _env(pytest="9.0.3", syrupy="7.0.3", ruff="0.9.0")  # lint tools: main env only
    assert same_versions.differences(tested, _env(pytest="9.0.3", syrupy="7.0.3")) == []


@pytest.mark.parametrize(
    ("other", "said"),
    [
        (_env(pytest="9.2.0", syrupy="7.0.3"), "pytest 9.2.0 (tested: 9.0.3)"),
        (_env(pytest="9.0.3", syrupy="7.0.3", gguf="0.1"), "gguf 0.1 (tested: not installed)"),
        (_env("3.11.10", pytest="9.0.3", syrupy="7.0.3"), "python '3.11.10' (tested '3.11.9')"),
    ],
    ids=["newer-release", "not-tested", "other-python"],
)
def test_any_difference_runs_the_step(
    same_versions: ModuleType, other: dict[str, object], said: str
) -> None:
    tested = _env(pytest="9.0.3", syrupy="7.0.3")
    assert same_versions.differences(tested, other) == [said]


def test_the_project_itself_is_not_a_difference(same_versions: ModuleType) -> None:
    tested = _env(**{"pytest-memeval": "0.1.0"})
    assert same_versions.differences(tested, _env(**{"pytest-memeval": "0.2.0"})) == []


def test_run_on_this_interpreter_against_itself(
    same_versions: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script for real: this interpreter against itself holds nothing new."""
    assert same_versions.main(["same_versions.py", sys.executable]) == 0
    assert "nothing new to test" in capsys.readouterr().out
