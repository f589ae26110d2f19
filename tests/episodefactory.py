"""Closed-loop run directories for tests, written by the real code path.

Each record is ``core.episode_records.episode_record`` of a real ``env.Episode``, and each
run directory is written by ``finalize_episode_run`` (a shard's with its
``core.sharding.shard_scope``), as the episode controller writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    episode_id,
    episode_record,
    finalize_episode_run,
)
from pytest_memeval.core.sharding import shard_dir_name, shard_scope, shard_slice
from pytest_memeval.env import Episode, StepRecord, TerminationReason, parse_env_spec

SPEC = parse_env_spec(
    {
        "backend": "textworld_express",
        "game": "twc",
        "params": "numLocations=1,numItemsToPutAway=2",
        "fold": "test",
        "seeds": "0-4",
        "max_steps": 5,
    }
)
ENV = {**SPEC.as_plain(), "version": "1.1.0"}
FINGERPRINTS: dict[str, Any] = {
    "model": "sha256:m",
    "adapter": None,
    "tokenizer": None,
    "decoding": "sha256:d",
    "env": ENV,
}
IDS = [episode_id(SPEC, seed) for seed in SPEC.seeds]
_REASONS = [
    TerminationReason.SUCCESS,
    TerminationReason.STEP_LIMIT,
    TerminationReason.INVALID_ACTIONS,
    TerminationReason.FAILURE,
    TerminationReason.SUCCESS,
]


def episode(seed: int, reason: TerminationReason | None = None) -> Episode:
    """A real episode of ``seed`` (its reason by default from the seed)."""
    reason = reason or _REASONS[seed % len(_REASONS)]
    actions = 1 + seed % 3
    steps = tuple(
        StepRecord(f"take {n}", f"obs {seed}.{n}", 0.5, 0.5, n % 2 == 0, False)
        for n in range(actions)
    )
    return Episode(
        seed=seed,
        reason=reason,
        steps=steps,
        observation=f"room {seed}",
        messages=({"role": "system", "content": "Tidy up."},),
        score=1.0 if reason is TerminationReason.SUCCESS else 0.5,
        error="EnvError: the JVM died" if reason is TerminationReason.ENV_ERROR else None,
    )


def records(errors: tuple[int, ...] = ()) -> dict[str, EpisodeRecord]:
    """Every seed's record; the seeds in ``errors`` ended in an environment error."""
    made = (episode(s, TerminationReason.ENV_ERROR if s in errors else None) for s in SPEC.seeds)
    return {r["id"]: r for r in (episode_record(SPEC, e) for e in made)}


def write_episode_run(
    run_dir: Path,
    *,
    shard: tuple[int, int] | None = None,
    held: Mapping[str, EpisodeRecord] | None = None,
    fingerprints: Mapping[str, Any] | None = None,
    profile: str = "twc",
) -> Path:
    """Write a (shard) run of the profile's seeds at ``run_dir`` with the records ``held``
    (default: every seed's, no error) of its slice; returns ``run_dir``."""
    held = records() if held is None else held
    ids = IDS if shard is None else shard_slice(IDS, *shard)
    run_dir.mkdir(parents=True, exist_ok=True)
    finalize_episode_run(
        run_dir,
        profile=profile,
        env=ENV,
        fingerprints=FINGERPRINTS if fingerprints is None else fingerprints,
        ids=ids,
        records={i: held[i] for i in ids if i in held},
        wall_s=2.0 if shard is None else float(shard[0]),
        shard=shard_scope(IDS, shard),
    )
    return run_dir


def write_episode_shards(parent: Path, n: int, **kwargs: Any) -> list[Path]:
    """Shards 1..``n`` of the profile's seeds at ``parent/shard-K-of-N``."""
    return [
        write_episode_run(parent / shard_dir_name(k, n), shard=(k, n), **kwargs)
        for k in range(1, n + 1)
    ]
