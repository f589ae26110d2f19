"""``.ci/newest_selection.py``: the newest-releases step of ``.ci/run`` reruns what a differing
release exercises: nothing when nothing differs; the unit tests and contracts on any
difference; a group's modules when one of its distributions differs; everything on another
Python."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / ".ci" / "newest_selection.py"


@pytest.fixture(scope="module")
def selection() -> ModuleType:
    spec = importlib.util.spec_from_file_location("newest_selection", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _env(python: str = "3.11.9", **dists: str) -> dict[str, object]:
    return {"python": python, "dists": {k.replace("_", "-"): v for k, v in dists.items()}}


TESTED = _env(pytest="9.0.3", syrupy="7.0.3", transformers="5.25.0", regex="2026.5.9")


def _group_tests(selection: ModuleType, name: str) -> set[str]:
    return {t for g in selection.GROUPS if g.name == name for t in g.tests}


def test_the_same_releases_rerun_nothing(selection: ModuleType) -> None:
    tested = {**TESTED, "dists": {**TESTED["dists"], "ruff": "0.9.0"}}  # type: ignore[dict-item]
    chosen = selection.select(tested, TESTED)  # lint tools: main env only
    assert chosen.differences == () and chosen.tests == ()


def test_a_pytest_release_reruns_the_pytest_modules_not_the_model_ones(
    selection: ModuleType,
) -> None:
    other = _env(pytest="9.2.0", syrupy="7.0.3", transformers="5.25.0", regex="2026.5.9")
    chosen = selection.select(TESTED, other)
    assert chosen.differences == ("pytest 9.2.0 (tested: 9.0.3)",)
    assert chosen.tests[:2] == selection.ALWAYS
    assert set(chosen.tests) == set(selection.ALWAYS) | _group_tests(selection, "pytest")
    assert "tests/integration/test_families.py" not in chosen.tests
    assert chosen.reasons == {"pytest": ("pytest",), "model": (), "environment": ()}
    assert len(chosen.tests) == len(set(chosen.tests))


def test_a_transformers_release_reruns_the_model_modules(selection: ModuleType) -> None:
    other = _env(pytest="9.0.3", syrupy="7.0.3", transformers="5.26.0", regex="2026.5.9")
    chosen = selection.select(TESTED, other)
    assert "tests/integration/test_families.py" in chosen.tests
    assert "tests/integration/test_scheduling.py" not in chosen.tests
    # test_e2e is in both groups and runs once
    assert chosen.tests.count("tests/integration/test_e2e.py") == 1


def test_a_release_in_no_group_reruns_the_unit_tests_and_contracts(
    selection: ModuleType,
) -> None:
    other = _env(pytest="9.0.3", syrupy="7.0.3", transformers="5.25.0", regex="2026.12.2")
    chosen = selection.select(TESTED, other)
    assert chosen.differences == ("regex 2026.12.2 (tested: 2026.5.9)",)
    assert chosen.tests == selection.ALWAYS


@pytest.mark.parametrize(
    ("other", "said"),
    [
        (
            _env(pytest="9.0.3", syrupy="7.0.3", transformers="5.25.0", regex="2026.5.9", gguf="1"),
            "gguf 1 (tested: not installed)",
        ),
        (
            _env(
                "3.11.10", pytest="9.0.3", syrupy="7.0.3", transformers="5.25.0", regex="2026.5.9"
            ),
            "python '3.11.10' (tested '3.11.9')",
        ),
    ],
    ids=["not-tested", "other-python"],
)
def test_an_untested_distribution_or_another_python_is_a_difference(
    selection: ModuleType, other: dict[str, object], said: str
) -> None:
    chosen = selection.select(TESTED, other)
    assert chosen.differences == (said,)
    if said.startswith("python"):  # another interpreter: every group
        assert set(chosen.reasons.values()) == {("python",)}
        assert set(chosen.tests) >= {t for g in selection.GROUPS for t in g.tests}


def test_the_project_itself_is_not_a_difference(selection: ModuleType) -> None:
    tested = _env(**{"pytest_memeval": "0.1.0"})
    assert selection.select(tested, _env(**{"pytest_memeval": "0.2.0"})).tests == ()


def test_every_test_path_it_can_select_exists(selection: ModuleType) -> None:
    paths = set(selection.ALWAYS) | {t for g in selection.GROUPS for t in g.tests}
    for path in paths:
        file, _, name = path.partition("::")
        assert (REPO / file).exists(), path
        if name:
            assert f"def {name}(" in (REPO / file).read_text("utf-8"), path


def test_run_on_this_interpreter_against_itself() -> None:
    """The script for real: this interpreter against itself has nothing to rerun."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), sys.executable], capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    assert "nothing new to test" in done.stderr
