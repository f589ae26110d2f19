"""Experiment trackers: a finished run logged where a team compares checkpoints over weeks.

Each tracker is a ``pytest_memeval_run_finished`` implementation registered only when asked
for (``--memeval-mlflow URI``: :mod:`.mlflow`). What a run is to a tracker (parameters,
metrics, tags, artifacts) is decided once, tracker-neutrally, in :mod:`.fields`.
"""

from pytest_memeval.tools.publish.tracking.fields import (
    GitState,
    episode_params,
    episode_run_metrics,
    finished_run_metrics,
    git_state,
    rate_metrics,
    run_metrics,
    run_params,
    run_tags,
    slice_metric_name,
    stage_artifacts,
)
from pytest_memeval.tools.publish.tracking.mlflow import MlflowTarget, log_finished_run

__all__ = [
    "GitState",
    "MlflowTarget",
    "episode_params",
    "episode_run_metrics",
    "finished_run_metrics",
    "git_state",
    "log_finished_run",
    "rate_metrics",
    "run_metrics",
    "run_params",
    "run_tags",
    "slice_metric_name",
    "stage_artifacts",
]
