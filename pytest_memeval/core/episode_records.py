"""A closed-loop run's records and metrics (docs/closed-loop.md, "Records and metrics").

One record per episode in ``predictions.jsonl`` (:class:`EpisodeRecord`, checked by
:func:`validate_episode_record`), the run's numbers in ``metrics.json``
(:class:`EpisodeRunMetrics`: :func:`~pytest_memeval.core.episodes.episode_metrics` over the
run and over each slice), and the recount: the numbers counted again from the records as
read back from the written file (:func:`recount_episodes`), as a scenario run's are.

Slices: every episode carries the tags of its environment (``game:twc``, ``fold:test``, one
``<param>=<value>`` per game parameter), so runs of several settings merged or compared are
sliced alike; a plugin's environment may add its own (``EnvInfo.extra["tags"]``).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from pytest_memeval.core.episodes import EpisodeMetrics, episode_metrics
from pytest_memeval.core.records import ShardScope
from pytest_memeval.core.rundir import METRICS, PREDICTIONS, atomic_write, write_json
from pytest_memeval.env import EnvSpec, Episode, StepRecord, TerminationReason

__all__ = [
    "EPISODE_RECORD_KIND",
    "EpisodeRecord",
    "EpisodeRecordError",
    "EpisodeRunMetrics",
    "EpisodeRunNumbers",
    "EpisodeScope",
    "MergedShard",
    "StepEntry",
    "env_tags",
    "episode_from_record",
    "episode_id",
    "episode_record",
    "episode_run_numbers",
    "finalize_episode_run",
    "read_episode_records",
    "recount_episodes",
    "validate_episode_record",
]

#: the ``kind`` of an episode record (a scenario record has none)
EPISODE_RECORD_KIND = "episode"


class EpisodeRecordError(ValueError):
    """A record or a file of them is malformed; the message names file, line and field."""


class StepEntry(TypedDict):
    """One step of a trajectory: the action, what the environment answered."""

    action: str
    observation: str
    reward: float
    score: float | None
    valid: bool | None
    truncated_output: bool


class EpisodeRecord(TypedDict):
    """One episode, as ``predictions.jsonl`` and the journal hold it."""

    kind: str
    #: ``<game>-<seed>``: the item's parameter id
    id: str
    seed: int
    success: bool
    reason: str
    score: float
    steps: int
    #: what the environment raised (reason ``env_error`` only)
    error: str | None
    #: the first observation
    observation: str
    #: the system message the model saw
    system: str | None
    trajectory: list[StepEntry]
    tags: list[str]


class EpisodeScope(TypedDict):
    """What part of the profile's seeds a run covers."""

    #: ``--memeval-shard K/N``: the slice of the seeds (core/sharding.py), else null
    shard: ShardScope | None


class MergedShard(TypedDict):
    """One shard run a merged run was made of (``memeval merge``)."""

    shard: str
    dir: str
    n: int
    first: str | None
    last: str | None


class _EpisodeRunMetricsOptional(TypedDict, total=False):
    #: when the metrics were written (UTC, ISO 8601): runlayout.resume_target's reference
    created: str
    #: which seeds the run covers (every run written by this version has it)
    scope: EpisodeScope
    #: a merged run: the shard runs it was made of
    merged_from: list[MergedShard]


class EpisodeRunMetrics(_EpisodeRunMetricsOptional):
    """``metrics.json`` of a closed-loop run."""

    kind: str
    profile: str
    #: what the run is of: backend and version, game, parameters, fold, seeds, limits
    env: dict[str, Any]
    fingerprints: dict[str, Any]
    #: every seed has a scored episode (no environment error, none missing, not a shard)
    complete: bool
    #: episode ids without a record (deselected, interrupted) and those in error
    missing: list[str]
    error_ids: list[str]
    #: the numbers over every episode (core/episodes.py)
    episodes: EpisodeMetrics
    #: the same numbers per tag
    slices: dict[str, EpisodeMetrics]
    wall_s: float | None


def episode_id(spec: EnvSpec, seed: int) -> str:
    """``<game>-<seed>``: the stable parameter id of an episode item."""
    return f"{spec.game}-{seed}"


def env_tags(spec: EnvSpec) -> list[str]:
    """The tags every episode of ``spec`` carries (its slices)."""
    tags = [f"game:{spec.game}"]
    if spec.fold is not None:
        tags.append(f"fold:{spec.fold}")
    tags.extend(f"{k}={v}" for k, v in spec.params)
    return tags


def episode_record(
    spec: EnvSpec, episode: Episode, extra_tags: Sequence[str] = ()
) -> EpisodeRecord:
    """The record of ``episode`` of ``spec``."""
    system = episode.messages[0]["content"] if episode.messages else None
    plain = episode.as_plain()
    return {
        "kind": EPISODE_RECORD_KIND,
        "id": episode_id(spec, episode.seed),
        "seed": episode.seed,
        "success": episode.success,
        "reason": episode.reason.value,
        "score": float(episode.score),
        "steps": len(episode.steps),
        "error": episode.error,
        "observation": episode.observation,
        "system": system,
        "trajectory": plain["trajectory"],
        "tags": [*env_tags(spec), *(t for t in extra_tags if t not in env_tags(spec))],
    }


_REASONS = {r.value for r in TerminationReason}
_STEP_FIELDS: dict[str, tuple[type, ...]] = {
    "action": (str,),
    "observation": (str,),
    "reward": (int, float),
    "score": (int, float, type(None)),
    "valid": (bool, type(None)),
    "truncated_output": (bool,),
}
_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "id": (str,),
    "seed": (int,),
    "success": (bool,),
    "reason": (str,),
    "score": (int, float),
    "steps": (int,),
    "error": (str, type(None)),
    "observation": (str,),
    "system": (str, type(None)),
    "trajectory": (list,),
    "tags": (list,),
}


def _check_fields(
    data: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]], where: str
) -> None:
    for name, kinds in fields.items():
        if name not in data:
            raise EpisodeRecordError(f"{where}: missing field {name!r}")
        value = data[name]
        numeric = kinds != (bool,) and bool not in kinds and isinstance(value, bool)
        if not isinstance(value, kinds) or numeric:
            raise EpisodeRecordError(
                f"{where}: field {name!r} must be {' or '.join(k.__name__ for k in kinds)}, "
                f"got {type(value).__name__}"
            )


def validate_episode_record(data: object, where: str) -> EpisodeRecord:
    """``data`` checked as an :class:`EpisodeRecord` (``where`` names file and line)."""
    if not isinstance(data, dict):
        raise EpisodeRecordError(f"{where}: an episode record must be an object")
    _check_fields(data, _FIELDS, where)
    where = f"{where}: episode {data['id']}"
    if data["kind"] != EPISODE_RECORD_KIND:
        raise EpisodeRecordError(f"{where}: field 'kind' must be {EPISODE_RECORD_KIND!r}")
    if data["reason"] not in _REASONS:
        raise EpisodeRecordError(
            f"{where}: field 'reason' must be one of {sorted(_REASONS)}, got {data['reason']!r}"
        )
    if data["success"] != (data["reason"] == TerminationReason.SUCCESS.value):
        raise EpisodeRecordError(f"{where}: 'success' disagrees with 'reason'")
    if data["steps"] != len(data["trajectory"]):
        raise EpisodeRecordError(f"{where}: 'steps' is not the trajectory's length")
    if not all(isinstance(t, str) for t in data["tags"]):
        raise EpisodeRecordError(f"{where}: field 'tags' must be a list of strings")
    for n, step in enumerate(data["trajectory"], start=1):
        if not isinstance(step, dict):
            raise EpisodeRecordError(f"{where}: trajectory step {n} must be an object")
        _check_fields(step, _STEP_FIELDS, f"{where}: trajectory step {n}")
    record: EpisodeRecord = data  # type: ignore[assignment]  # checked field by field above
    return record


def episode_from_record(record: EpisodeRecord) -> Episode:
    """The episode a record holds (its conversation is not stored: ``messages`` is empty)."""
    steps = tuple(
        StepRecord(
            s["action"],
            s["observation"],
            float(s["reward"]),
            None if s["score"] is None else float(s["score"]),
            s["valid"],
            s["truncated_output"],
        )
        for s in record["trajectory"]
    )
    return Episode(
        seed=record["seed"],
        reason=TerminationReason(record["reason"]),
        steps=steps,
        observation=record["observation"],
        messages=(),
        score=float(record["score"]),
        error=record["error"],
    )


def read_episode_records(path: Path) -> list[EpisodeRecord]:
    """Every record of an episode run's ``predictions.jsonl``, each checked."""
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EpisodeRecordError(f"{path}:{lineno}: not JSON ({exc})") from None
            records.append(validate_episode_record(data, f"{path}:{lineno}"))
    return records


class EpisodeRunNumbers(NamedTuple):
    """An episode run's numbers: over every record, and per tag (tags sorted)."""

    overall: EpisodeMetrics
    slices: dict[str, EpisodeMetrics]


def episode_run_numbers(records: Iterable[EpisodeRecord]) -> EpisodeRunNumbers:
    """The numbers over ``records`` and per tag (tags sorted)."""
    kept = list(records)
    overall = episode_metrics([episode_from_record(r) for r in kept])
    tags = sorted({t for r in kept for t in r["tags"]})
    slices = {
        tag: episode_metrics([episode_from_record(r) for r in kept if tag in r["tags"]])
        for tag in tags
    }
    return EpisodeRunNumbers(overall, slices)


def recount_episodes(path: Path, metrics: Mapping[str, Any]) -> list[str]:
    """The differences between ``metrics`` (its ``episodes`` and ``slices``) and the numbers
    counted again from the records in ``path``; empty when they agree."""
    overall, slices = episode_run_numbers(read_episode_records(path))
    differences = []
    if json.dumps(overall, sort_keys=True) != json.dumps(metrics.get("episodes"), sort_keys=True):
        differences.append("episodes")
    for tag in sorted(set(slices) | set(metrics.get("slices") or {})):
        mine = json.dumps(slices.get(tag), sort_keys=True)
        if mine != json.dumps((metrics.get("slices") or {}).get(tag), sort_keys=True):
            differences.append(f"slices[{tag}]")
    return differences


def finalize_episode_run(
    run_dir: Path,
    *,
    profile: str,
    env: Mapping[str, Any],
    fingerprints: Mapping[str, Any],
    ids: Sequence[str],
    records: Mapping[str, EpisodeRecord],
    wall_s: float | None,
    shard: ShardScope | None = None,
    merged_from: Sequence[MergedShard] | None = None,
) -> EpisodeRunMetrics:
    """Write ``predictions.jsonl`` (the records in ``ids`` order) and then ``metrics.json``,
    each atomically; the numbers are counted from the records as read back from the written
    file, and must equal those counted from the records in memory (the recount).

    ``ids`` are the episodes the run is of (a shard's: its slice); ``shard`` its
    ``core/sharding.shard_scope`` (a shard run is never ``complete``); ``merged_from`` the
    shards a merged run was made of (``memeval merge``)."""
    ordered = [records[i] for i in ids if i in records]
    ordered += [records[i] for i in sorted(records) if i not in set(ids)]
    path = run_dir / PREDICTIONS
    atomic_write(path, (json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    overall, slices = episode_run_numbers(read_episode_records(path))
    metrics: EpisodeRunMetrics = {
        "kind": "episodes",
        "profile": profile,
        "env": dict(env),
        "fingerprints": dict(fingerprints),
        "complete": False,
        "missing": [i for i in ids if i not in records],
        "error_ids": [r["id"] for r in ordered if r["reason"] == TerminationReason.ENV_ERROR.value],
        "episodes": overall,
        "slices": slices,
        "wall_s": wall_s,
        "scope": {"shard": shard},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if merged_from is not None:
        metrics["merged_from"] = list(merged_from)
    metrics["complete"] = not metrics["missing"] and not metrics["error_ids"] and shard is None
    in_memory = episode_run_numbers(ordered)
    if json.dumps(in_memory, sort_keys=True) != json.dumps((overall, slices), sort_keys=True):
        raise EpisodeRecordError(f"{path}: the recount differs from the records written")
    write_json(run_dir / METRICS, metrics)
    return metrics
