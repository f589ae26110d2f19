"""``--memeval-mlflow URI``: each complete run logged as one MLflow run, read back through
MLflow's own client from a real local store (``sqlite://``), under ``-n 2``; a subset is not
logged; a tracker that fails is reported and changes nothing; without MLflow, one message.

MLflow imports in seconds and creates its sqlite schema in about ten: the runs here are slow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..conftest import MemevalProject, demo_records
from ..runfactory import make_record, write_crafted, write_run

N = 6

pytest.importorskip("mlflow", reason="MLflow is in the test extra (pytest-memeval[mlflow])")


@pytest.fixture
def crafted(memeval_project: MemevalProject) -> tuple[MemevalProject, list[dict[str, Any]]]:
    """6 demo scenarios replayed, the first final answer wrong."""
    recs = demo_records("baseline", N)
    write_crafted(memeval_project, recs, wrong_final=[recs[0]["id"]])
    return memeval_project, recs


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _artifacts(client: Any, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


@pytest.mark.slow
# This test's own MlflowClient reads the store: MLflow's noise (core/noise.py) in this process.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_a_complete_run_is_logged_and_a_subset_is_not(
    crafted: tuple[MemevalProject, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project, recs = crafted
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("GITHUB_SHA", "0123456789abcdef0123456789abcdef01234567")
    base = write_run(
        tmp_path / "reference",
        [make_record(r["id"], i, final_match=True) for i, r in enumerate(recs)],
        ckpt="reference",
    )
    result = project.run(
        "-n",
        "2",
        "--ckpt",
        "crafted",
        "--memeval-mlflow",
        uri,
        "--memeval-mlflow-experiment=team evals",
        "--memeval-min-m1=0.5",
        f"--memeval-baseline={base}",
        "--memeval-max-drop=50",
        "--html=report.html",
        "--self-contained-html",
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert f"experiment 'team evals' at {uri}" in out
    assert "noload" not in out  # MLflow's own deprecation noise stays out of the user's summary
    client = _client(uri)
    experiment = client.get_experiment_by_name("team evals")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # one MLflow run per eval, logged by the controller only
    run = runs[0]
    assert f"memeval: MLflow run {run.info.run_id} logged to" in out
    assert run.info.status == "FINISHED" and run.info.run_name == "crafted"
    metrics = project.metrics("crafted")
    assert run.data.metrics["m1"] == pytest.approx(metrics["m1"]["rate"])
    assert run.data.metrics["m1_correct"] == N - 1 and run.data.metrics["m1_total"] == N
    assert [run.data.metrics["m1_ci95_low"], run.data.metrics["m1_ci95_high"]] == (
        pytest.approx(metrics["m1"]["ci95"])
    )
    assert run.data.metrics["m2_ci95_high"] == pytest.approx(metrics["m2"]["ci95"][1])
    params = run.data.params
    assert params["ckpt"] == "crafted" and params["kind"] == "replay"
    assert params["predictions"] == str(project.path / "crafted.jsonl")
    assert params["fingerprint.benchmark"] == metrics["fingerprints"]["benchmark"]
    assert params["decoding.path"] == "replay"
    tags = run.data.tags
    assert tags["memeval.complete"] == "true" and tags["memeval.gate"] == "passed"
    assert tags["memeval.exitstatus"] == "0"
    # pytester's project is no git checkout: the commit comes from the CI variable.
    assert tags["mlflow.source.git.commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert sorted(_artifacts(client, run.info.run_id)) == [
        "pytest-html/report.html",
        "report.html",
        "run/journal.jsonl",
        "run/metrics.json",
        "run/predictions.jsonl",
        "summary.md",
    ]
    local = Path(client.download_artifacts(run.info.run_id, "run/metrics.json", str(tmp_path)))
    assert json.loads(local.read_text("utf-8")) == metrics
    # A subset (-k) is not logged: the experiment keeps what it had.
    result = project.run(
        "-n", "2", "--ckpt", "crafted", "--memeval-mlflow", uri, "-k", recs[1]["id"]
    )
    assert (
        "the run is incomplete" in result.stdout.str()
        and "only complete runs" in result.stdout.str()
    )
    assert client.get_experiment_by_name("memeval") is None  # nothing logged anywhere
    assert len(client.search_runs([experiment.experiment_id])) == 1


@pytest.mark.slow
def test_a_tracker_that_fails_is_reported_and_changes_nothing(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    project, _ = crafted
    # A server that is not there (loopback, a port nothing listens on), no retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    result = project.run(
        "--ckpt", "crafted", "--memeval-min-m1=0", "--memeval-mlflow", "http://127.0.0.1:9"
    )
    assert result.ret == pytest.ExitCode.OK  # the gate passed: the eval's result stands
    result.stdout.fnmatch_lines(
        ["*memeval: MLflow: logging to experiment 'memeval' at http://127.0.0.1:9 failed (*"]
    )
    assert project.metrics("crafted")["complete"] is True


def test_without_mlflow_one_clear_message(
    crafted: tuple[MemevalProject, list[dict[str, Any]]],
) -> None:
    project, _ = crafted
    # As if it were not installed: Python's own marker for a module that cannot be imported.
    (project.path / "conftest.py").write_text(
        "import sys\n\nsys.modules['mlflow'] = None\n", "utf-8"
    )
    result = project.run("-n", "2", "--ckpt", "crafted", "--memeval-mlflow", "sqlite:///m.db")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(result.errlines)
    assert err.count("--memeval-mlflow needs MLflow, which is not installed here") == 1
    assert "pip install 'pytest-memeval[mlflow]'" in err
    assert "Traceback" not in err + result.stdout.str()
    assert not (project.path / "runs").exists() and not (project.path / "m.db").exists()


def test_mlflow_option_needs_an_evaluation(memeval_project: MemevalProject) -> None:
    memeval_project.write(n=1)
    result = memeval_project.pytester.runpytest("--memeval-mlflow", "sqlite:///m.db")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--memeval-mlflow needs an evaluation: give --ckpt NAME" in "\n".join(result.errlines)
