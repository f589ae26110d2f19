"""Tagged scenarios end to end: a pytest run writes the tags into the records and the slices
into metrics.json, shows them when asked (option or ini) and in pytest-html's summary, gates
per slice, and refuses malformed tags and unknown slices before anything runs.

The crafted replay's plain run (``--ckpt crafted``, and ``--html`` where pytest-html is
installed) is made once for the module: it is the run without the option whose summary stays
as it was, the serial run a ``-n 2`` run must equal, and the run whose HTML page shows the
slices (a replay process costs seconds; three tests shared one such run's arguments)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.tools.cli import main

from ..conftest import MemevalProject, demo_records, write_jsonl, write_project
from ..moduleruns import run_pytest
from ..runfactory import (
    CRAFTED_PROFILE,
    content,
    make_record,
    read_jsonl,
    replay_source,
    write_crafted,
    write_run,
)

# Slow: pytest runs in subprocesses (one under xdist).
pytestmark = pytest.mark.slow


def _tagged_records() -> list[dict[str, Any]]:
    """6 demo scenarios: the first 3 'query:door', the last 3 'query:where'; 2 'hard'."""
    recs = demo_records("baseline", 6)
    for i, rec in enumerate(recs):
        rec["tags"] = [f"query:{'door' if i < 3 else 'where'}"] + (["hard"] if i in (0, 4) else [])
        rec["meta"] = {"source": "test", "i": i}
    return recs


#: the crafted replay's wrong answers: scenario 1 (door) its final answer, 4 (where) a turn
WRONG = {"wrong_final": [1], "wrong_turn": [4]}


def _replayed(recs: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {key: [recs[i]["id"] for i in at] for key, at in WRONG.items()}


@dataclass(frozen=True)
class PlainRun:
    """The module's ``--ckpt crafted`` run: its output, records, metrics and HTML page."""

    result: pytest.RunResult
    predictions: list[dict[str, Any]]
    metrics: dict[str, Any]
    page: str | None


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> PlainRun:
    """The crafted replay (as :func:`tagged` writes it) run with no slices option or ini."""
    root = tmp_path_factory.mktemp("slices-plain")
    recs = _tagged_records()
    write_project(root, recs, profiles=CRAFTED_PROFILE)
    write_jsonl(root / "crafted.jsonl", replay_source(recs, **_replayed(recs)))
    html = importlib.util.find_spec("pytest_html") is not None
    extra = ["--html=report.html", "--self-contained-html"] if html else []
    result = run_pytest(root, "--ckpt", "crafted", *extra)
    run = root / "runs" / "crafted"
    return PlainRun(
        result,
        read_jsonl(run / "predictions.jsonl"),
        json.loads((run / "metrics.json").read_text("utf-8")),
        (root / "report.html").read_text("utf-8") if html else None,
    )


@pytest.fixture
def tagged(memeval_project: MemevalProject) -> tuple[MemevalProject, list[dict[str, Any]]]:
    """The crafted replay: scenario 1 (door) has a wrong final answer, 4 (where) a wrong turn."""
    recs = _tagged_records()
    write_crafted(memeval_project, recs, **_replayed(recs))
    return memeval_project, recs


def _check_run(project: MemevalProject, recs: list[dict[str, Any]]) -> None:
    predictions = project.predictions("crafted")
    assert [p["tags"] for p in predictions] == [r["tags"] for r in recs]
    assert [p["meta"] for p in predictions] == [r["meta"] for r in recs]
    slices = project.metrics("crafted")["slices"]
    assert list(slices) == ["hard", "query:door", "query:where"]
    door = slices["query:door"]
    assert (door["n"], door["m1"]["correct"], door["m1"]["total"]) == (3, 2, 3)
    assert door["m1"]["ci95_method"] == "wilson" and door["m1_mde_pp"] is None
    where = slices["query:where"]
    assert where["m2"]["correct"] == where["m2"]["total"] - 1  # the one wrong turn
    assert where["m2"]["clusters"] == 3


def test_slices_in_records_metrics_and_the_summary(
    tagged: tuple[MemevalProject, list[dict[str, Any]]],
    plain: PlainRun,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project, recs = tagged
    result = project.run("--ckpt", "crafted", "--memeval-slices")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # two wrong answers, no gate
    result.stdout.fnmatch_lines(
        [
            "slices (3 tags; a scenario counts in every slice it is tagged with):",
            "  slice * n  m1 final-query*m1 MDE",
            "  hard  * 2  2/2 = 100.00%*",
            "  query:door  * 3  2/3 = 66.67%*",
            "  query:where * 3  3/3 = 100.00%*",
        ]
    )
    _check_run(project, recs)
    assert main(["recount", str(project.run_dir("crafted"))]) == 0
    assert "memeval recount: OK" in capsys.readouterr().out
    # Without the option (or the ini) the summary stays as it was.
    assert "slices (" not in plain.result.stdout.str()


@pytest.mark.slow
def test_slices_under_xdist_and_from_the_ini(
    tagged: tuple[MemevalProject, list[dict[str, Any]]], plain: PlainRun
) -> None:
    project, recs = tagged
    serial = plain.result  # a serial run of the same project (laid out once for the module)
    assert serial.ret == pytest.ExitCode.TESTS_FAILED
    serial_records, serial_metrics = plain.predictions, plain.metrics
    toml = project.path / "pyproject.toml"
    toml.write_text(
        toml.read_text("utf-8").replace(
            'addopts = "-p no:cacheprovider',
            'memeval_slices = true\naddopts = "-p no:cacheprovider',
        ),
        "utf-8",
    )
    result = project.run("-n", "2", "--ckpt", "crafted")
    result.stdout.fnmatch_lines(["slices (3 tags;*", "  query:door  * 3  2/3 = 66.67%*"])
    _check_run(project, recs)
    assert content(project.predictions("crafted")) == content(serial_records)
    assert project.metrics("crafted")["slices"] == serial_metrics["slices"]


def test_pytest_html_summary_shows_the_slices(plain: PlainRun) -> None:
    pytest.importorskip("pytest_html")
    page = plain.page
    assert page is not None
    assert "by slice (tag)" in page
    for text in ("query:door", "2/3 = 66.67%", "query:where", "hard"):
        assert text in page


def test_gates_per_slice(
    tagged: tuple[MemevalProject, list[dict[str, Any]]], tmp_path: Path
) -> None:
    project, recs = tagged
    # A reference run that got everything right, tagged the same way.
    ref_records = []
    for i, rec in enumerate(recs):
        ref = make_record(rec["id"], i, final_match=True)
        ref["tags"] = rec["tags"]
        ref_records.append(ref)
    ref = write_run(tmp_path / "ref", ref_records, ckpt="ref")
    result = project.run(
        "--ckpt",
        "crafted",
        "--memeval-min-m1",
        "query:where=0.9",
        "--memeval-min-m1=query:door=0.9",
        f"--memeval-baseline={ref}",
        "--memeval-max-drop",
        "50",
        "--memeval-max-drop",
        "query:door&hard=0",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "WARN  --memeval-max-drop query:door&hard=0: 0 pp is smaller than what the slice's "
            "1 scenarios can resolve*",
            "PASS  m1 drop vs baseline <= 50.00 pp:*",
            "PASS  m1[[]query:where[]] >= 90.00%: 100.00% (3/3), 10.00 pp above the threshold",
            "FAIL  m1[[]query:door[]] >= 90.00%: 66.67% (2/3), 23.33 pp below the threshold",
            "PASS  m1[[]query:door&hard[]] drop vs baseline <= 0.00 pp: 100.00% vs 100.00% in "
            f"{ref}*",
            "gate FAILED: exit status 1",
        ]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--memeval-min-m1", "query:dor=0.8"],
            "--memeval-min-m1 'query:dor=0.8': slice 'query:dor': no scenario carries the tag "
            "'query:dor'; the tags are: hard, query:door, query:where",
        ),
        (["--memeval-min-m1", "query:door=85"], "a rate must lie between 0 and 1"),
        (["--memeval-min-m1", "0.5", "--memeval-min-m1", "0.6"], "given 2 values"),
        (["--memeval-max-drop", "query:door=1"], "--memeval-max-drop needs --memeval-baseline"),
    ],
)
def test_bad_slice_gates_are_refused_before_anything_runs(
    memeval_project: MemevalProject, args: list[str], message: str
) -> None:
    write_crafted(memeval_project, _tagged_records())
    result = memeval_project.pytester.runpytest("--ckpt", "crafted", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in "\n".join(result.errlines + result.outlines)


def test_malformed_tags_are_refused_naming_the_line_and_scenario(
    memeval_project: MemevalProject,
) -> None:
    recs = _tagged_records()
    recs[2]["tags"] = ["query door"]
    write_crafted(memeval_project, recs)
    result = memeval_project.pytester.runpytest("--ckpt", "crafted")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = "\n".join(result.errlines + result.outlines)
    assert f"bench.jsonl:3 (scenario {recs[2]['id']!r}): field 'tags[0]': tag 'query door'" in text
    assert not (memeval_project.path / "runs").exists()


def test_json_of_a_tagged_run_is_plain(tmp_path: Path) -> None:
    """metrics.json's slices block is plain JSON a tracker can log per tag."""
    records = [make_record(f"s{i}", i, final_match=i % 2 == 0) for i in range(8)]
    for i, rec in enumerate(records):
        rec["tags"] = ["even" if i % 2 == 0 else "odd"]
    run = write_run(tmp_path / "r", records, ckpt="r")
    slices = json.loads((run / "metrics.json").read_text("utf-8"))["slices"]
    assert set(slices) == {"even", "odd"}
    assert set(slices["even"]) == {"n", "m1", "m2", "unaligned", "m1_mde_pp"}
    assert slices["even"]["m1"]["rate"] == 1.0 and slices["odd"]["m1"]["rate"] == 0.0
