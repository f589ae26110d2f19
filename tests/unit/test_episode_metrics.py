"""A closed-loop run's numbers from its episodes; environment errors counted apart."""

from __future__ import annotations

import json

import pytest

from pytest_memeval.core.episodes import episode_metrics
from pytest_memeval.core.stats import wilson_interval
from pytest_memeval.env import Episode, StepRecord, TerminationReason

R = TerminationReason


def _episode(
    seed: int, reason: TerminationReason, valid: list[bool | None], score: float
) -> Episode:
    steps = tuple(
        StepRecord(f"a{i}", f"o{i}\nmore", 0.0, score, v, truncated_output=(i == 0 and seed == 4))
        for i, v in enumerate(valid)
    )
    error = "EnvError: the environment's step() did not return within 60 s"
    return Episode(
        seed, reason, steps, "start", (), score, error if reason is R.ENV_ERROR else None
    )


EPISODES = [
    _episode(0, R.SUCCESS, [True, True, True], 1.0),
    _episode(1, R.SUCCESS, [True, False, True, True, True], 1.0),
    _episode(2, R.STEP_LIMIT, [False] * 4, 0.5),
    _episode(3, R.ENV_ERROR, [False, False], 0.0),  # left out of every count below
    _episode(4, R.CONTEXT_LIMIT, [None, True], 0.0),
    _episode(5, R.ENV_ERROR, [], 0.0),
]


def test_the_run_numbers_leave_environment_errors_out() -> None:
    metrics = episode_metrics(EPISODES)
    assert json.loads(json.dumps(metrics)) == metrics
    assert metrics["episodes"] == 6 and metrics["errors"] == 2 and metrics["error_seeds"] == [3, 5]
    assert metrics["success"] == {
        "correct": 2,
        "total": 4,
        "rate": 0.5,
        "ci95": list(wilson_interval(2, 4)),
        "ci95_method": "wilson",
    }
    assert metrics["mean_score"] == pytest.approx((1.0 + 1.0 + 0.5 + 0.0) / 4)
    assert metrics["steps"] == {"total": 14, "mean": 3.5, "mean_successful": 4.0}
    assert metrics["invalid_actions"] == {"invalid": 5, "judged": 13, "rate": 5 / 13}
    assert metrics["truncated_outputs"] == 1
    assert metrics["reasons"] == {
        "success": 2,
        "failure": 0,
        "step_limit": 1,
        "env_truncated": 0,
        "invalid_actions": 0,
        "context_limit": 1,
        "env_error": 2,
    }


def test_no_scored_episode_gives_null_rates() -> None:
    metrics = episode_metrics([EPISODES[3]])
    assert metrics["success"]["rate"] is None and metrics["mean_score"] is None
    assert metrics["steps"] == {"total": 0, "mean": None, "mean_successful": None}
    assert metrics["invalid_actions"]["rate"] is None


def test_an_episodes_summary_says_how_it_ended() -> None:
    assert EPISODES[0].summary() == "seed 0: success after 3 action(s), score 1; last 'a2' -> 'o2'"
    assert EPISODES[2].summary() == (
        "seed 2: step limit after 4 action(s) (4 invalid), score 0.5; last 'a3' -> 'o3'"
    )
    assert EPISODES[5].summary() == (
        "seed 5: env error after 0 action(s), score 0; "
        "EnvError: the environment's step() did not return within 60 s"
    )
