"""Closed-loop run directories for tests, written by the real code path.

Each record is ``core.episode_records.episode_record`` of a real ``env.Episode``, and each
run directory is written by ``finalize_episode_run`` (a shard's with its
``core.sharding.shard_scope``), as the episode controller writes them. Two families: runs of
the profile's seeds (:func:`write_episode_run`, :func:`write_episode_shards`: the merge, gate
and Slurm tests), and the runs the pages are tested on (:func:`write_incomplete_episode_run`,
:func:`write_complete_episode_run`: a success, a step limit, an invalid-action stop with an
action that tries to inject markup, and an environment error; tags long enough to need
wrapping).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    EpisodeRunMetrics,
    episode_id,
    episode_record,
    finalize_episode_run,
)
from pytest_memeval.core.sharding import shard_dir_name, shard_scope, shard_slice
from pytest_memeval.env import Episode, StepRecord, TerminationReason, parse_env_spec

from .pages import INJECTED

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


#: a plugin environment's own tag, long, with no space or hyphen to break at (it must wrap)
LONG_TAG = "curriculum:" + "_".join(["kitchen", "bathroom", "laundry", "garden", "attic"] * 8)


def _steps(pairs: list[tuple[str, str, bool | None]]) -> tuple[StepRecord, ...]:
    return tuple(
        StepRecord(action, observation, 1.0 if n == len(pairs) - 1 else 0.0, float(n), valid, False)
        for n, (action, observation, valid) in enumerate(pairs)
    )


def page_episodes() -> list[Episode]:
    """Five episodes of five ends; seed 2 acts ``INJECTED`` and is told it is not valid."""
    system = ({"role": "system", "content": "Tidy up. <b>no markup</b>"},)
    won = _steps(
        [("take apple", "You take the apple.", True), ("put apple in fridge", "Done.", True)]
    )
    lost = _steps([("look", "A kitchen.", True), ("wait", "Time passes.", None)])
    return [
        Episode(0, TerminationReason.SUCCESS, won, "You are in a kitchen.", system, 2.0, None),
        Episode(1, TerminationReason.STEP_LIMIT, lost, "You are in a kitchen.", system, 0.0, None),
        Episode(
            2,
            TerminationReason.INVALID_ACTIONS,
            (StepRecord(INJECTED, "I don't understand <that>.", 0.0, 0.0, False, True),),
            "You are in a kitchen & a hall.",
            system,
            0.0,
            None,
        ),
        Episode(
            3, TerminationReason.ENV_ERROR, (), "You are in a kitchen.", system, 0.0, "JVM died"
        ),
    ]


def write_incomplete_episode_run(run_dir: Path) -> EpisodeRunMetrics:
    """Seeds 0-3 run (seed 3 an environment error), seed 4 missing: an incomplete run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records = {
        episode_id(SPEC, e.seed): episode_record(
            SPEC, e, extra_tags=[LONG_TAG] if e.seed < 2 else []
        )
        for e in page_episodes()
    }
    return finalize_episode_run(
        run_dir,
        profile="smol-twc",
        env={
            "backend": "textworld_express",
            "version": "1.1.0",
            "game": "twc",
            "fold": "test",
            "seeds": list(SPEC.seeds),
        },
        fingerprints={"model": "sha256:m", "adapter": None, "env": {"game": "twc"}},
        ids=[episode_id(SPEC, s) for s in SPEC.seeds],
        records=records,
        wall_s=3.5,
    )


def write_complete_episode_run(run_dir: Path) -> EpisodeRunMetrics:
    """Seeds 0-2 only, every one scored: a complete run (trackers log only those)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    kept = [e for e in page_episodes() if e.seed < 3]
    return finalize_episode_run(
        run_dir,
        profile="smol-twc",
        env={"backend": "textworld_express", "version": "1.1.0", "game": "twc", "fold": "test"},
        fingerprints={"model": "sha256:m", "env": {"game": "twc"}},
        ids=[episode_id(SPEC, e.seed) for e in kept],
        records={episode_id(SPEC, e.seed): episode_record(SPEC, e) for e in kept},
        wall_s=2.0,
    )
