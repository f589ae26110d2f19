"""Which closed-loop runs a comparison (or a gate's baseline) takes: loading each, refusing
what would mislead.

An episode run (``metrics.json`` of kind ``episodes``, docs/closed-loop.md) is compared only
when it is finished, passes the recount of its records (:func:`load_episode_run`) and is
complete: every seed has a scored episode, none ended in an environment error. Two runs are
compared only over the same environment (backend, game, parameters, fold:
:func:`check_same_env`) and the same seeds (:func:`check_same_episodes`), and never an
episode run with a scenario run (:func:`check_same_kind`). Each refusal is a
:class:`~pytest_memeval.tools.compare.types.CompareError` whose message says why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    EpisodeRecordError,
    EpisodeRunMetrics,
    read_episode_records,
    recount_episodes,
)
from pytest_memeval.core.formatting import shown_ids, shown_list
from pytest_memeval.core.rundir import METRICS, PREDICTIONS
from pytest_memeval.tools.compare.load import refuse_different_ids
from pytest_memeval.tools.compare.types import CompareError

__all__ = [
    "ENV_IDENTITY",
    "EPISODES_KIND",
    "EpisodeRun",
    "check_same_env",
    "check_same_episodes",
    "check_same_kind",
    "env_notes",
    "is_episode_run",
    "load_episode_run",
    "read_episode_run",
    "read_metrics_kind",
    "recount_episode_run",
    "why_incomplete",
]

#: ``metrics.json``'s ``kind`` of a closed-loop run (a scenario run's is another, or none)
EPISODES_KIND = "episodes"
#: what makes two environments the same task: their episodes are paired only then
ENV_IDENTITY = ("backend", "game", "params", "fold")
#: what may differ between two compared runs of one environment, said in a note
_ENV_NOTED = ("version", "max_steps", "invalid_action_limit")


@dataclass(frozen=True)
class EpisodeRun:
    """A finished episode run read back and checked: its metrics, and its records by
    episode id in the order of ``predictions.jsonl`` (the order of the seeds)."""

    path: Path
    metrics: EpisodeRunMetrics
    records: dict[str, EpisodeRecord]

    @property
    def label(self) -> str:
        """The run directory's name (``smol-twc``)."""
        return self.path.name

    @property
    def ckpt(self) -> str:
        """The profile's name (the checkpoint), else the directory's."""
        return str(self.metrics.get("profile") or self.path.name)


def read_metrics_kind(path: Path) -> str | None:
    """``metrics.json``'s ``kind`` in run directory ``path``; ``None`` where the file is
    missing or unreadable (the scenario loader then says why), or holds no kind."""
    try:
        data = json.loads((path / METRICS).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def is_episode_run(path: Path) -> bool:
    """Whether ``path`` holds a closed-loop run (``metrics.json`` of kind ``episodes``)."""
    return read_metrics_kind(path) == EPISODES_KIND


def check_same_kind(paths: Sequence[Path]) -> bool:
    """Whether the runs are episode runs; refuse a mix of episode and scenario runs. A path
    without a readable ``metrics.json`` counts as neither (its loader says what is wrong)."""
    kinds = {p: read_metrics_kind(p) for p in paths}
    known = {p: k == EPISODES_KIND for p, k in kinds.items() if k is not None}
    if any(known.values()) and not all(known.values()):
        shown = "; ".join(
            f"{p} is {'an episode run (closed loop)' if episodes else 'a scenario run'}"
            for p, episodes in known.items()
        )
        raise CompareError(
            f"the runs are of two kinds ({shown}): an episode's success and a scenario's "
            "answer are not paired outcomes. Compare episode runs with episode runs"
        )
    return any(known.values())


def _read_metrics(path: Path) -> EpisodeRunMetrics:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != EPISODES_KIND:
        raise CompareError(f"{path}: not the metrics of an episode run (kind {EPISODES_KIND!r})")
    for key in ("env", "episodes", "slices", "missing", "error_ids", "complete"):
        if key not in data:
            raise CompareError(f"{path}: missing key {key!r}")
    metrics: EpisodeRunMetrics = data  # type: ignore[assignment]  # its keys checked above
    return metrics


def why_incomplete(metrics: EpisodeRunMetrics) -> str:
    """Why an episode run is incomplete: its environment errors and episodes not run."""
    parts = []
    if metrics["error_ids"]:
        parts.append(
            f"environment error in {len(metrics['error_ids'])} episode(s): "
            f"{shown_ids(metrics['error_ids'])} (rerun them with --memeval-resume)"
        )
    if metrics["missing"]:
        parts.append(
            f"{len(metrics['missing'])} episode(s) not run: {shown_ids(metrics['missing'])}"
        )
    return "; ".join(parts) or "metrics.json says complete: false"


def read_episode_run(path: Path) -> EpisodeRun:
    """Read a finished episode run (its metrics and records, each checked), complete or not
    and not recounted; raise :class:`CompareError` naming the file and why."""
    if not path.is_dir():
        raise CompareError(f"{path}: not a run directory")
    if not (path / METRICS).is_file():
        raise CompareError(f"{path}: no {METRICS}: not a finished run")
    if not (path / PREDICTIONS).is_file():
        raise CompareError(f"{path / PREDICTIONS}: missing (it belongs beside {METRICS})")
    metrics = _read_metrics(path / METRICS)
    try:
        records = read_episode_records(path / PREDICTIONS)
    except EpisodeRecordError as exc:
        raise CompareError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path / PREDICTIONS}: unreadable ({exc})") from None
    by_id = {r["id"]: r for r in records}
    if len(by_id) != len(records):
        raise CompareError(f"{path / PREDICTIONS}: an episode id appears twice")
    return EpisodeRun(path=path, metrics=metrics, records=by_id)


def recount_episode_run(run: EpisodeRun) -> list[str]:
    """The blocks of ``metrics.json`` (``episodes``, ``slices[TAG]``) that differ from the
    numbers counted again from ``predictions.jsonl``; empty when they agree."""
    try:
        return recount_episodes(run.path / PREDICTIONS, run.metrics)
    except EpisodeRecordError as exc:
        raise CompareError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{run.path / PREDICTIONS}: unreadable ({exc})") from None


def load_episode_run(path: Path) -> EpisodeRun:
    """Load a finished, complete episode run that passes the recount of its records; raise
    :class:`CompareError` naming the file and why otherwise."""
    run = read_episode_run(path)
    differences = recount_episode_run(run)
    if differences:
        raise CompareError(
            f"{path}: fails the recount: {METRICS} differs from the records in "
            f"{shown_list(differences)}"
        )
    if run.metrics["complete"] is not True:
        raise CompareError(
            f"{path}: incomplete episode run, refusing to compare it "
            f"({why_incomplete(run.metrics)})"
        )
    return run


def _shown_env(env: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {env.get(key)!r}" for key in ENV_IDENTITY)


def check_same_env(env_a: Mapping[str, Any], env_b: Mapping[str, Any], a: str, b: str) -> None:
    """Refuse two environments that are not the same task (``a``, ``b``: what to call them)."""
    differ = [key for key in ENV_IDENTITY if env_a.get(key) != env_b.get(key)]
    if differ:
        raise CompareError(
            f"the runs are of different environments ({', '.join(differ)} differ): {a} has "
            f"{_shown_env(env_a)}; {b} has {_shown_env(env_b)}. Episodes are paired only "
            "within one environment"
        )


def check_same_episodes(ids_a: Sequence[str], ids_b: Sequence[str], a: str, b: str) -> None:
    """Refuse two runs whose episodes (seeds) differ, naming those only in one."""
    refuse_different_ids(ids_a, ids_b, a, b, "episodes (seeds)")


def env_notes(env_a: Mapping[str, Any], env_b: Mapping[str, Any]) -> list[str]:
    """What differs between two environments of one task (a note, not a refusal)."""
    return [
        f"{key} differs: A {env_a.get(key)!r}, B {env_b.get(key)!r}"
        for key in _ENV_NOTED
        if env_a.get(key) != env_b.get(key)
    ]
