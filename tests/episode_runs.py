"""Episode run directories written by the real code path (``finalize_episode_run``) from real
``Episode`` objects: a success, a step limit, an invalid-action stop with an action that tries
to inject markup, and an environment error; tags long enough to need wrapping."""

from __future__ import annotations

from pathlib import Path

from pytest_memeval.core.episode_records import (
    EpisodeRunMetrics,
    episode_id,
    episode_record,
    finalize_episode_run,
)
from pytest_memeval.env import Episode, StepRecord, TerminationReason, parse_env_spec

from .pages import INJECTED

SPEC = parse_env_spec(
    {
        "backend": "textworld_express",
        "game": "twc",
        "params": "numLocations=1,numItemsToPutAway=2",
        "fold": "test",
        "seeds": "0-4",
    }
)
#: a plugin environment's own tag, long, with no space or hyphen to break at (it must wrap)
LONG_TAG = "curriculum:" + "_".join(["kitchen", "bathroom", "laundry", "garden", "attic"] * 8)


def _steps(pairs: list[tuple[str, str, bool | None]]) -> tuple[StepRecord, ...]:
    return tuple(
        StepRecord(action, observation, 1.0 if n == len(pairs) - 1 else 0.0, float(n), valid, False)
        for n, (action, observation, valid) in enumerate(pairs)
    )


def episodes() -> list[Episode]:
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


def write_episode_run(run_dir: Path) -> EpisodeRunMetrics:
    """Seeds 0-3 run (seed 3 an environment error), seed 4 missing: an incomplete run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records = {
        episode_id(SPEC, e.seed): episode_record(
            SPEC, e, extra_tags=[LONG_TAG] if e.seed < 2 else []
        )
        for e in episodes()
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
    kept = [e for e in episodes() if e.seed < 3]
    return finalize_episode_run(
        run_dir,
        profile="smol-twc",
        env={"backend": "textworld_express", "version": "1.1.0", "game": "twc", "fold": "test"},
        fingerprints={"model": "sha256:m", "env": {"game": "twc"}},
        ids=[episode_id(SPEC, e.seed) for e in kept],
        records={episode_id(SPEC, e.seed): episode_record(SPEC, e) for e in kept},
        wall_s=2.0,
    )
