"""``--memeval-mlflow URI``: log each finished eval as one MLflow run.

Any MLflow tracking URI works (``sqlite:///mlflow.db``, ``http://mlflow.internal:5000``,
``databricks``, a ``file:`` store); ``--memeval-mlflow-experiment NAME`` (ini
``memeval_mlflow_experiment``; default ``$MLFLOW_EXPERIMENT_NAME``, else ``memeval``) picks
the experiment, created if needed. The run is named after the run directory (``oracle``,
``oracle@checkpoint-500-…``) and gets :mod:`.fields`' parameters, metrics, tags (with the git
commit as ``mlflow.source.git.commit``, which MLflow's UI shows) and artifacts, then is
marked ``FINISHED``.

**Only complete runs are logged.** A ``-k``/``--lf`` subset, a run with missing scenarios, a
run stopped by ``-x`` or Ctrl-C and a shard are not logged at all (the terminal says so): an
experiment's runs are what a team compares over weeks, and a partial m1 among them reads like
a regression. Nothing is ever overwritten: each finished eval is a new MLflow run. If logging
fails half-way (the server went away), the half-logged run is deleted (MLflow keeps it as
deleted, out of the experiment's list) and the failure is reported in red; the eval's result,
files and exit status stand.

MLflow is optional (``pip install 'pytest-memeval[mlflow]'``: MLflow's client,
``mlflow-skinny``, with SQLAlchemy and Alembic for a ``sqlite://`` store; the full ``mlflow``
package works too). It is imported only when a run is logged; without it,
``--memeval-mlflow`` is a usage error with one message, before anything runs.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from pytest_memeval.core.noise import third_party_noise_filtered
from pytest_memeval.runtime.episodes import EPISODE_STATE_KEY
from pytest_memeval.runtime.state import STATE_KEY, is_worker
from pytest_memeval.tools.publish.finished import FinishedRun, report_output
from pytest_memeval.tools.publish.tracking.fields import (
    finished_run_metrics,
    git_state,
    run_params,
    run_tags,
    stage_artifacts,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["DEFAULT_EXPERIMENT", "MISSING", "MlflowTarget", "log_finished_run", "mlflow_target"]

#: the experiment when neither the option, the ini value nor $MLFLOW_EXPERIMENT_NAME names one
DEFAULT_EXPERIMENT = "memeval"
#: the one message when MLflow is asked for and not installed
MISSING = (
    "--memeval-mlflow needs MLflow, which is not installed here: "
    "pip install 'pytest-memeval[mlflow]' (MLflow's client with what a sqlite:// store "
    "needs), or pip install mlflow"
)
#: what MLflow accepts in one log_batch call (mlflow.utils.validation)
_BATCH_METRICS, _BATCH_PARAMS = 1000, 100

_T = TypeVar("_T")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-mlflow",
        dest="memeval_mlflow",
        metavar="URI",
        default=None,
        help="log each complete run as an MLflow run to this tracking URI (sqlite:///mlflow.db, "
        "http://host:5000, ...): parameters, m1/m2 with intervals, tags, the run's files and "
        "HTML report. Needs pytest-memeval[mlflow]. Default: memeval_mlflow ini.",
    )
    group.addoption(
        "--memeval-mlflow-experiment",
        dest="memeval_mlflow_experiment",
        metavar="NAME",
        default=None,
        help="MLflow experiment for --memeval-mlflow (created if needed; default: "
        f"$MLFLOW_EXPERIMENT_NAME, else {DEFAULT_EXPERIMENT!r})",
    )
    parser.addini("memeval_mlflow", "MLflow tracking URI to log complete runs to", default=None)
    parser.addini("memeval_mlflow_experiment", "MLflow experiment for memeval_mlflow", default=None)


@dataclass(frozen=True)
class MlflowTarget:
    """Where runs are logged: a tracking URI and an experiment name."""

    uri: str
    experiment: str


def mlflow_target(config: pytest.Config) -> MlflowTarget | None:
    """The option (or ini value) of this session, or ``None`` when MLflow is not asked for."""
    uri = config.getoption("memeval_mlflow", None) or config.getini("memeval_mlflow")
    if not uri:
        return None
    experiment = (
        config.getoption("memeval_mlflow_experiment", None)
        or config.getini("memeval_mlflow_experiment")
        or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        or DEFAULT_EXPERIMENT
    )
    return MlflowTarget(str(uri), str(experiment))


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _experiment_id(client: MlflowClient, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except MlflowException:
        # Another job created it in between (two CI jobs logging at once).
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def log_finished_run(target: MlflowTarget, run: FinishedRun, project_root: Path) -> str:
    """Log ``run`` as one new MLflow run and return its id (raises what MLflow raises;
    a run left half-logged is deleted first)."""
    # MLflow's own deprecation noise (core/noise.py) is not the user's to act on.
    with third_party_noise_filtered():
        return _log(target, run, project_root)


def _log(target: MlflowTarget, run: FinishedRun, project_root: Path) -> str:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=target.uri)
    experiment_id = _experiment_id(client, target.experiment)
    git = git_state(project_root)
    tags = run_tags(run, git)
    if git.commit:
        tags["mlflow.source.git.commit"] = git.commit
    created = client.create_run(experiment_id, run_name=run.label, tags=tags)
    run_id = str(created.info.run_id)
    try:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in finished_run_metrics(run).items()]
        params = [Param(k, v) for k, v in run_params(run).items()]
        for metric_chunk in _chunks(metrics, _BATCH_METRICS):
            client.log_batch(run_id, metrics=list(metric_chunk))
        for param_chunk in _chunks(params, _BATCH_PARAMS):
            client.log_batch(run_id, params=list(param_chunk))
        with tempfile.TemporaryDirectory(prefix="memeval-mlflow-") as staging:
            stage_artifacts(run, Path(staging))
            client.log_artifacts(run_id, staging)
        client.set_tag(run_id, "memeval.logged", "complete")
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        # The original failure is what the user needs to see, not a second one.
        with contextlib.suppress(Exception):
            client.delete_run(run_id)
        raise
    return run_id


class MlflowLogger:
    """Registered on the controller when ``--memeval-mlflow`` (or the ini value) is given."""

    def __init__(self, target: MlflowTarget) -> None:
        self.target = target

    def pytest_memeval_run_finished(self, config: pytest.Config, run: FinishedRun) -> None:
        where = f"experiment {self.target.experiment!r} at {self.target.uri}"
        if not run.complete:
            report_output(
                config,
                f"memeval: MLflow: not logged to {where}: the run is incomplete (a subset, "
                "missing scenarios, a stop or a shard); only complete runs are tracked",
            )
            return
        try:
            run_id = log_finished_run(self.target, run, config.rootpath)
        except Exception as exc:
            report_output(
                config,
                f"memeval: MLflow: logging to {where} failed ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}); "
                "nothing was kept there",
                problem=True,
            )
            return
        report_output(config, f"memeval: MLflow run {run_id} logged to {where}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config):
        return  # only the controller logs
    target = mlflow_target(config)
    if target is None:
        return
    if STATE_KEY not in config.stash and EPISODE_STATE_KEY not in config.stash:
        if config.getoption("memeval_mlflow", None):
            raise pytest.UsageError(
                "--memeval-mlflow needs an evaluation: give --ckpt NAME (without it no run "
                "is written, so nothing would be logged)"
            )
        return  # the ini value, in a session that evaluates nothing
    if importlib.util.find_spec("mlflow") is None:
        raise pytest.UsageError(MISSING)
    config.pluginmanager.register(MlflowLogger(target), "memeval-mlflow")
