"""A closed-loop run published, for real: the tiny demo checkpoint plays three TextWorld
Express episodes (two steps each) in one pytest run that writes the CI step summary
(``$GITHUB_STEP_SUMMARY``), a JUnit file with the run's suite properties and an MLflow run (a
``file:`` store); then ``memeval report`` writes the run's page. One run, shared by the tests
of this module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from pytest_memeval.tools.cli import main

from .. import forkserver
from ..envs import require_textworld, twc_profile, write_pyproject
from ..pages import Page

pytestmark = pytest.mark.slow  # one pytest run with a model and a JVM: about 20 CPU-s

#: a team's own publisher: what it receives for an episode run
TEAM_PUBLISHER = """
import json

def pytest_memeval_run_finished(config, run):
    seen = {"kind": run.kind, "ckpt": run.ckpt, "complete": run.complete,
            "episodes": run.episodes["episodes"]["episodes"], "gate": run.gate is None,
            "same": run.metrics is run.episodes, "run_dir": str(run.run_dir)}
    (config.rootpath / "team.json").write_text(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_textworld()
    root = tmp_path_factory.mktemp("episode-publish")
    write_pyproject(root, twc_profile("twc", "0-2"), conftest=TEAM_PUBLISHER)
    summary = root / "step-summary.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["GITHUB_STEP_SUMMARY"] = str(summary)
    env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a file: store, no database (MLflow 3 asks)
    args = ["--ckpt", "twc", "-n", "0", "--junitxml=junit.xml"]
    mlflow = None
    if importlib.util.find_spec("mlflow") is not None:  # the extra: log the run too
        mlflow = (root / "mlruns").as_uri()
        args += ["--memeval-mlflow", mlflow, "--memeval-mlflow-experiment", "episodes"]
    python = forkserver.interpreter(env)
    proc = subprocess.run(
        [python.executable, "-m", "pytest", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=python.env,
        check=False,
    )
    out = proc.stdout + proc.stderr
    # The demo checkpoint does not solve the game in two steps: the items fail, the run is written.
    assert proc.returncode == 1, out[-3000:]
    run_dir = root / "runs" / "twc"
    page = root / "report.html"
    assert main(["report", str(run_dir), "-o", str(page)]) == 0
    return {
        "out": out,
        "summary": summary.read_text("utf-8"),
        "junit": ET.parse(root / "junit.xml").getroot(),
        "metrics": json.loads((run_dir / "metrics.json").read_text("utf-8")),
        "page": page.read_text("utf-8"),
        "mlflow": mlflow,
        "team": json.loads((root / "team.json").read_text("utf-8")),
        "run_dir": run_dir,
    }


def test_the_step_summary_holds_the_episode_numbers(published: dict[str, Any]) -> None:
    text = published["summary"]
    success = published["metrics"]["episodes"]["success"]
    assert "### memeval closed loop: twc" in text
    assert f"| success | {success['correct']}/3 = " in text and "exit status 1" in text
    assert "| `game:twc` | 3 |" in text
    assert "memeval: Markdown summary appended to $GITHUB_STEP_SUMMARY" in published["out"]


def test_the_junit_suite_carries_the_run_and_each_episode(published: dict[str, Any]) -> None:
    suite = published["junit"].find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.find("properties") or []}
    numbers = published["metrics"]["episodes"]
    assert props["memeval.kind"] == "episodes" and props["memeval.complete"] == "true"
    assert props["memeval.episodes"] == "3"
    assert props["memeval.success.total"] == "3"
    assert props["memeval.steps"] == str(numbers["steps"]["total"])
    assert props["memeval.reason.step_limit"] == str(numbers["reasons"]["step_limit"])
    # Each episode's own properties, as before.
    cases = suite.findall("testcase")
    assert len(cases) == 3
    assert all(c.find("properties/property[@name='memeval_seed']") is not None for c in cases)


def test_the_run_is_logged_to_mlflow(
    published: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if published["mlflow"] is None:
        pytest.skip("MLflow is in the test extra (pytest-memeval[mlflow])")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert "memeval: MLflow run " in published["out"], published["out"][-2000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=published["mlflow"])
    experiment = client.get_experiment_by_name("episodes")
    assert experiment is not None, published["out"][-2000:]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.params["run_kind"] == "episodes" and run.data.params["env.game"] == "twc"
    assert run.data.metrics["success_total"] == 3.0
    assert run.data.metrics["steps"] == published["metrics"]["episodes"]["steps"]["total"]
    # The artifacts: the run's files, its episode page and its Markdown summary.
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"run", "report.html", "summary.md"} <= names, names


def test_the_report_shows_each_trajectory(published: dict[str, Any]) -> None:
    html = published["page"]
    visible = "".join(Page(html).text)
    records_total = published["metrics"]["episodes"]["steps"]["total"]
    assert "memeval closed loop: twc" in visible and "95% Wilson interval" in visible
    for seed in range(3):
        assert f"twc-{seed}" in visible
    assert html.count("<tr><td class='num'>0</td>") == 3  # each episode's first observation
    assert html.count("class='steps'") == 3 and records_total > 0


def test_a_teams_publisher_gets_the_episode_run(published: dict[str, Any]) -> None:
    assert published["team"] == {
        "kind": "episodes",
        "ckpt": "twc",
        "complete": True,
        "episodes": 3,
        "gate": True,
        "same": True,
        "run_dir": str(published["run_dir"]),
    }
