"""A closed-loop run's numbers, from its episodes (docs/closed-loop.md).

An episode that ended in an environment error (:attr:`TerminationReason.ENV_ERROR`) says
nothing about the model: it is counted apart (``errors``, ``error_seeds``) and left out of
every rate, mean and count below it, so a run with errors is incomplete, never worse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from pytest_memeval.core.records import RateBlock
from pytest_memeval.core.stats import rate_with_ci
from pytest_memeval.env import Episode, TerminationReason

__all__ = ["EpisodeMetrics", "InvalidCounts", "StepCounts", "episode_metrics"]


class StepCounts(TypedDict):
    """Actions per episode: the mean over scored episodes and over successful ones."""

    total: int
    mean: float | None
    mean_successful: float | None


class InvalidCounts(TypedDict):
    """Invalid actions over the actions whose validity the environment told (no interval:
    the actions of one episode are not independent draws)."""

    invalid: int
    judged: int
    rate: float | None


class EpisodeMetrics(TypedDict):
    """The numbers of a set of episodes (JSON-able)."""

    #: every episode run, errors included
    episodes: int
    #: episodes that ended in an environment error, and their seeds (in run order)
    errors: int
    error_seeds: list[int]
    #: successes over the scored episodes, with the 95% Wilson interval
    success: RateBlock
    mean_score: float | None
    steps: StepCounts
    invalid_actions: InvalidCounts
    #: actions whose output stopped at the token limit
    truncated_outputs: int
    #: each termination reason's count (every reason named, 0 included; errors too)
    reasons: dict[str, int]


def episode_metrics(episodes: Sequence[Episode]) -> EpisodeMetrics:
    """Count ``episodes``; the environment's errors apart (see the module's docstring)."""
    errors = [e for e in episodes if e.is_error]
    scored = [e for e in episodes if not e.is_error]
    won = [e for e in scored if e.success]
    judged = [s.valid for e in scored for s in e.steps if s.valid is not None]
    reasons = {r.value: 0 for r in TerminationReason}
    for episode in episodes:
        reasons[episode.reason.value] += 1
    return {
        "episodes": len(episodes),
        "errors": len(errors),
        "error_seeds": [e.seed for e in errors],
        "success": rate_with_ci(len(won), len(scored)),
        "mean_score": _mean([e.score for e in scored]),
        "steps": {
            "total": sum(len(e.steps) for e in scored),
            "mean": _mean([len(e.steps) for e in scored]),
            "mean_successful": _mean([len(e.steps) for e in won]),
        },
        "invalid_actions": {
            "invalid": judged.count(False),
            "judged": len(judged),
            "rate": judged.count(False) / len(judged) if judged else None,
        },
        "truncated_outputs": sum(s.truncated_output for e in scored for s in e.steps),
        "reasons": reasons,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
