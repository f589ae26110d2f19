"""``pytest --ckpt NAME`` in a user's own project: the plugin provides the eval items.

A project directory outside this repository (pytester's) holding only a ``bench.jsonl`` and
a ``pyproject.toml`` profile over the bundled demo checkpoint (the model by absolute path,
the adapter by a path relative to the project, the benchmark relative or absolute):

* with no test module, ``pytest --ckpt mine`` evaluates every scenario with
  ``memeval::test_final_query[<id>]`` and ``memeval::test_turns[<id>]``, with and without
  xdist, named with no path or with the project's own absolute path;
* a project whose module imports the items keeps exactly its items (no ``memeval::`` ones);
* a run that names a path holding no eval items runs what it names and names no run
  directory;
* a run whose eval items are all deselected says so in one line, exits non-zero, names no
  run directory and writes none.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from pytest_memeval.runtime.startup import nothing_selected

from ..conftest import (
    ADAPTERS,
    BASE_MODEL,
    EVAL_MODULE,
    INNER_ADDOPTS,
    demo_records,
    run_forked,
    write_jsonl,
)

pytestmark = pytest.mark.slow

N = 2  # scenarios: enough for two workers, small for a 2-core machine
FUNCS = ("test_final_query", "test_turns")


def _project(pytester: pytest.Pytester, *, absolute_benchmark: bool = False) -> Path:
    """A user's project: ``bench.jsonl`` and a ``pyproject.toml`` with profile ``mine``."""
    root = Path(pytester.path)
    assert not root.resolve().is_relative_to(Path(__file__).resolve().parents[2])
    bench = write_jsonl(root / "bench.jsonl", demo_records("oracle", N))
    adapter = Path(os.path.relpath(ADAPTERS / "oracle", root)).as_posix()
    assert not Path(adapter).is_absolute()
    benchmark = bench.as_posix() if absolute_benchmark else "bench.jsonl"
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.pytest.ini_options]
            addopts = "{INNER_ADDOPTS}"

            [tool.memeval.ckpt.mine]
            model = "{BASE_MODEL.as_posix()}"
            adapter = "{adapter}"
            benchmark = "{benchmark}"
            generation = {{ max_new_tokens = 16 }}
            """
        ),
        "utf-8",
    )
    return root


def _ids() -> list[str]:
    return [r["id"] for r in demo_records("oracle", N)]


def _junit_items(path: Path) -> list[str]:
    """``classname::name`` of every test case of a JUnit XML file, in file order."""
    cases = ElementTree.parse(path).getroot().iter("testcase")
    return [f"{case.attrib['classname']}::{case.attrib['name']}" for case in cases]


@pytest.mark.parametrize(
    ("xdist", "where"),
    [
        pytest.param([], "none", id="no-xdist-no-path"),
        pytest.param(["-n", "2"], "absolute", id="n2-absolute-path"),
    ],
)
def test_a_project_without_a_test_module_is_evaluated(
    pytester: pytest.Pytester, xdist: list[str], where: str
) -> None:
    root = _project(pytester, absolute_benchmark=where == "absolute")
    paths = [str(root)] if where == "absolute" else []
    junit = root / "junit.xml"
    result = run_forked(
        pytester, "--ckpt", "mine", "-v", f"--junitxml={junit}", *xdist, *paths, timeout=600
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), output
    expected = {f"memeval::{f}[{sid}]" for sid in _ids() for f in FUNCS}
    reported = _junit_items(junit)
    assert sorted(reported) == sorted(expected), output  # each item once
    result.stdout.fnmatch_lines([f"*memeval::test_final_query[[]{_ids()[0]}[]]*"])
    result.stdout.fnmatch_lines([f"memeval: run directory {root / 'runs' / 'mine'}"])
    metrics = json.loads((root / "runs" / "mine" / "metrics.json").read_text("utf-8"))
    assert metrics["scope"]["evaluated"] == N and metrics["complete"] is True, metrics
    predictions = (root / "runs" / "mine" / "predictions.jsonl").read_text("utf-8")
    assert [json.loads(line)["id"] for line in predictions.splitlines()] == _ids()


def test_a_project_that_imports_the_items_keeps_exactly_its_own(
    pytester: pytest.Pytester,
) -> None:
    root = _project(pytester)
    (root / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    (root / "test_other.py").write_text("def test_other():\n    pass\n", "utf-8")
    listed = run_forked(pytester, "--ckpt", "mine", "--collect-only", "-q")
    assert listed.ret == pytest.ExitCode.OK, listed.stdout.str() + listed.stderr.str()
    ids = [line for line in listed.stdout.lines if "::" in line]
    expected = [f"test_eval.py::{f}[{sid}]" for sid in _ids() for f in FUNCS]
    assert sorted(ids) == sorted([*expected, "test_other.py::test_other"])
    assert not any(line.startswith("memeval::") for line in ids)

    # Without test_eval.py the same collection has the plugin's items beside test_other.
    (root / "test_eval.py").unlink()
    listed = run_forked(pytester, "--ckpt", "mine", "--collect-only", "-q")
    ids = [line for line in listed.stdout.lines if "::" in line]
    provided = [f"memeval::{f}[{sid}]" for sid in _ids() for f in FUNCS]
    assert sorted(ids) == sorted([*provided, "test_other.py::test_other"])


def test_a_named_path_without_eval_items_runs_what_it_names(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _project(pytester)
    (root / "test_other.py").write_text("def test_other():\n    pass\n", "utf-8")
    result = run_forked(pytester, "--ckpt", "mine", "test_other.py")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    assert "memeval: run directory" not in result.stdout.str()
    assert not (root / "runs").exists()
    # The project's root named as a relative path ("." here, ".." from a folder
    # inside it) is the whole project: the plugin's items are there.
    (root / "sub").mkdir()
    for where, path in ((root, "."), (root / "sub", "..")):
        monkeypatch.chdir(where)
        listed = run_forked(pytester, "--ckpt", "mine", "--co", "-q", path)
        ids = [line for line in listed.stdout.lines if "::" in line]
        provided = [f"memeval::{f}[{sid}]" for sid in _ids() for f in FUNCS]
        assert sorted(ids) == sorted([*provided, "test_other.py::test_other"]), path


@pytest.mark.parametrize("xdist", [pytest.param([], id="no-xdist"), pytest.param(["-n", "2"])])
def test_every_eval_item_deselected_is_one_line_and_writes_nothing(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    root = _project(pytester)
    (root / "test_other.py").write_text("def test_other():\n    pass\n", "utf-8")
    for selection in (["-k", "no_such_item"], ["-k", "test_other"]):
        result = run_forked(pytester, "--ckpt", "mine", *xdist, *selection)
        output = result.stdout.str() + result.stderr.str()
        assert result.ret == pytest.ExitCode.USAGE_ERROR, output
        line = f"ERROR: {nothing_selected('mine', 2 * N)}"
        assert result.stderr.lines.count(line) == 1, output
        assert "memeval: run directory" not in output
        assert "INTERNALERROR" not in output
        assert not (root / "runs").exists()
