"""An episode run published: ``memeval report``'s page (tools/report/episodes.py), the step
summary, the JUnit suite properties and the tracker fields of a closed-loop run, each read
from a run directory written by ``finalize_episode_run`` from real ``Episode`` objects."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_memeval.core.profiles import BenchmarkSpec, Profile
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import CompareError, fmt_ci
from pytest_memeval.tools.publish import (
    FinishedRun,
    add_suite_properties,
    finished_run_markdown,
    suite_properties,
)
from pytest_memeval.tools.publish.tracking import (
    GitState,
    MlflowTarget,
    finished_run_metrics,
    log_finished_run,
    run_params,
    run_tags,
)
from pytest_memeval.tools.report import load_episode_run, write_report

from ..episodefactory import LONG_TAG, write_complete_episode_run, write_incomplete_episode_run
from ..pages import INJECTED, Page

PROFILE = Profile(
    name="smol-twc",
    kind="model",
    benchmark=BenchmarkSpec(path=Path("/unused.jsonl")),
    source=Path("/proj/pyproject.toml"),
    model=Path("/models/base"),
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    write_incomplete_episode_run(tmp_path / "smol-twc")
    return tmp_path / "smol-twc"


def _finished(run_dir: Path) -> FinishedRun:
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    return FinishedRun(
        ckpt="smol-twc",
        run_dir=run_dir,
        run_root=run_dir,
        metrics=metrics,
        profile=PROFILE,
        exitstatus=1,
        episodes=metrics,
    )


def test_the_page_shows_the_numbers_and_every_trajectory_as_text(run_dir: Path) -> None:
    page = run_dir.parent / "report.html"
    assert main(["report", str(run_dir), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    dom = Page(html)
    visible = "".join(dom.text)
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    success = metrics["episodes"]["success"]
    assert (success["correct"], success["total"]) == (1, 3)  # the error is not counted
    assert "1/3 = 33.33%" in visible and f"95% Wilson interval {fmt_ci(success)}" in visible
    assert "invalid actions" in visible and "INCOMPLETE" in visible
    assert "environment error in 1 episode(s); 1 episode(s) not run" in visible
    # Each trajectory: the first observation, then each action and what came back.
    for text in ("You are in a kitchen & a hall.", "take apple", "You take the apple."):
        assert text in visible
    assert "step limit" in visible and "JVM died" in visible
    # The model's markup is shown as its characters and is never markup.
    assert visible.count(INJECTED) == 1 and "I don't understand <that>." in visible
    assert "&lt;script&gt;document.title=" in html and "<script>" not in html
    assert not [a for tag, a in dom.tags if tag == "img" or a.get("id") == "pwned"]
    assert "<b>no markup</b>" in visible  # the system message, escaped
    # The by-slice table, its long tag in a cell that wraps.
    assert LONG_TAG in visible and "<td class='tag'>" in html


def test_a_tampered_episode_run_is_refused_naming_its_file(run_dir: Path) -> None:
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    metrics["episodes"]["success"]["correct"] = 3
    (run_dir / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    with pytest.raises(CompareError, match=r"metrics.json: the numbers differ from the recount"):
        load_episode_run(run_dir)
    with pytest.raises(CompareError, match="one episode run at a time"):
        write_report([run_dir, run_dir], run_dir.parent / "two.html")
    assert not (run_dir.parent / "two.html").exists()


def test_a_malformed_record_is_refused_naming_file_and_line(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (run_dir / "predictions.jsonl").open("a", encoding="utf-8") as fh:
        fh.write('{"kind": "episode"}\n')
    page = run_dir.parent / "report.html"
    assert main(["report", str(run_dir), "-o", str(page)]) == 2
    err = capsys.readouterr().err
    assert f"memeval report: refused: {run_dir / 'predictions.jsonl'}:5: missing field 'id'" in err
    assert not page.exists()


def test_markdown_of_an_episode_run(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "| success | 1/3 = 33.33% |" in text and "**incomplete**" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| `curriculum:")]
    assert row.endswith("characters) | 2 | 1/2 = 50.00% | [9.45%, 90.55%] | 1.00 | 0.00% |")
    # The CI step summary of the finished session is the same text, with its exit status.
    summary = finished_run_markdown(_finished(run_dir))
    assert "| success | 1/3 = 33.33% |" in summary and "exit status 1" in summary


def test_junit_suite_properties_of_an_episode_run(run_dir: Path) -> None:
    props = dict(suite_properties(_finished(run_dir)))
    assert props["memeval.kind"] == "episodes" and props["memeval.complete"] == "false"
    assert props["memeval.success_rate"] == f"{1 / 3:.6f}"
    assert (props["memeval.success.correct"], props["memeval.success.total"]) == ("1", "3")
    assert (
        float(props["memeval.success.ci95_low"]) < 1 / 3 < float(props["memeval.success.ci95_high"])
    )
    assert props["memeval.errors"] == "1" and props["memeval.missing"] == "1"
    assert props["memeval.reason.invalid_actions"] == "1"
    assert (
        props["memeval.invalid_actions"] == "1" and props["memeval.fingerprint.model"] == "sha256:m"
    )
    junit = run_dir.parent / "junit.xml"
    junit.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest"/></testsuites>')
    assert add_suite_properties(junit, list(props.items())) == 1
    names = [p.get("name") for p in ET.parse(junit).getroot().iter("property")]
    assert "memeval.success_rate" in names and "memeval.mean_score" in names


def test_tracker_fields_of_an_episode_run(run_dir: Path) -> None:
    run = _finished(run_dir)
    params = run_params(run)
    assert params["run_kind"] == "episodes" and params["env.game"] == "twc"
    assert params["env.seeds"] == "[0, 1, 2, 3, 4]" and params["fingerprint.model"] == "sha256:m"
    metrics = finished_run_metrics(run)
    assert metrics["success"] == pytest.approx(1 / 3) and metrics["success_total"] == 3.0
    assert metrics["reason/step_limit"] == 1.0 and metrics["wall_s"] == 3.5
    assert metrics["slice/game:twc/success_correct"] == 1.0
    assert run_tags(run, GitState(None, None))["memeval.kind"] == "episodes"


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_a_complete_episode_run_is_logged_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="MLflow is in the test extra (pytest-memeval[mlflow])")
    # A ``file:`` store: no database to create (MLflow 3 asks to be told it is wanted).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "smol-twc"
    write_complete_episode_run(run_dir)
    uri = (tmp_path / "mlruns").as_uri()
    run_id = log_finished_run(MlflowTarget(uri, "episodes"), _finished(run_dir), tmp_path)
    logged = MlflowClient(tracking_uri=uri).get_run(run_id).data
    assert logged.metrics["success"] == pytest.approx(1 / 3)
    assert logged.params["run_kind"] == "episodes" and logged.tags["memeval.kind"] == "episodes"
    assert logged.tags["memeval.logged"] == "complete"
