"""Two models' three ways as paired tests: each model after the first against the first.

The three-ways comparison (:mod:`.ways`) sets the models side by side; this says whether they
differ, way by way, on the same seeds paired by id, with the tests the two-run comparisons
use:

- **m2 teacher-forced** and **m2 free-running**: the paired m2 difference of the two models'
  scenario runs (``compare_runs``: scenarios whose turns line up in both, an exact sign-flip
  test, a cluster interval); free-running only where both models have that run;
- **m1** (the final scene question, teacher-forced): the exact McNemar test and Newcombe's
  paired interval;
- **success** in the closed loop: the same on the episodes (``compare_episode_runs``).

A pair makes up to four tests, so its p-values are Holm-adjusted over the ways it has (the
family-wise error of reading "these models differ somewhere" off any of them). Nothing pairs
a way with another: an answer and a success are never one outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from pytest_memeval.core.stats import holm
from pytest_memeval.tools.compare.episode_runs import EpisodeRun
from pytest_memeval.tools.compare.episodes import compare_episode_runs
from pytest_memeval.tools.compare.pair import compare_runs
from pytest_memeval.tools.compare.types import ALPHA, Comparison, McNemar, RunData

__all__ = ["WayDifference", "WaysDifference", "WaysGroup", "ways_differences"]


class WaysGroup(TypedDict):
    """One model's runs (:func:`.ways.load_ways`): teacher-forced, free-running if made, and
    the closed loop, over the same seeds."""

    teacher_forced: RunData
    free_running: RunData | None
    closed_loop: EpisodeRun


class WayDifference(TypedDict):
    """Model B against model A on one way, paired by seed."""

    way: str
    #: B minus A in percentage points, and its 95% interval (paired)
    delta_pp: float | None
    ci95_pp: list[float] | None
    test: str
    p_value: float | None
    #: Holm-adjusted over the ways of this pair, and whether it is below ``alpha``
    p_holm: float | None
    significant_holm: bool | None


class WaysDifference(TypedDict):
    """One model (``b``) against the first (``a``), way by way."""

    a: str
    b: str
    seeds: int
    alpha: float
    ways: list[WayDifference]


def _m2(way: str, pair: Comparison) -> WayDifference:
    paired = pair["m2_paired"]
    return {
        "way": way,
        "delta_pp": paired["delta_pp"],
        "ci95_pp": paired["ci95_pp"],
        "test": paired["test"],
        "p_value": paired["p_value"],
        "p_holm": None,
        "significant_holm": None,
    }


def _binary(
    way: str, delta_pp: float | None, ci: list[float] | None, test: McNemar
) -> WayDifference:
    return {
        "way": way,
        "delta_pp": delta_pp,
        "ci95_pp": ci,
        "test": test["test"],
        "p_value": test["p_value"],
        "p_holm": None,
        "significant_holm": None,
    }


def _holm_over_the_ways(ways: list[WayDifference]) -> None:
    """Set each way's Holm-adjusted p-value, over the ways of the pair that have one."""
    tested = [w for w in ways if w["p_value"] is not None]
    for way, adjusted in zip(tested, holm([w["p_value"] or 0.0 for w in tested]), strict=True):
        way["p_holm"] = adjusted
        way["significant_holm"] = adjusted < ALPHA


def _pair(a: WaysGroup, b: WaysGroup, label_a: str, label_b: str) -> WaysDifference:
    teacher_forced = compare_runs(a["teacher_forced"], b["teacher_forced"])
    ways = [_m2("m2 teacher-forced", teacher_forced)]
    if a["free_running"] is not None and b["free_running"] is not None:
        ways.append(_m2("m2 free-running", compare_runs(a["free_running"], b["free_running"])))
    ways.append(
        _binary(
            "m1",
            teacher_forced["m1_delta_pp"],
            teacher_forced["m1_delta_ci95_pp"],
            teacher_forced["mcnemar"],
        )
    )
    loop = compare_episode_runs(a["closed_loop"], b["closed_loop"])
    ways.append(
        _binary("success", loop["success_delta_pp"], loop["success_delta_ci95_pp"], loop["mcnemar"])
    )
    _holm_over_the_ways(ways)
    return {"a": label_a, "b": label_b, "seeds": loop["n"], "alpha": ALPHA, "ways": ways}


def ways_differences(groups: Sequence[WaysGroup], labels: Sequence[str]) -> list[WaysDifference]:
    """Each model after the first against the first (``groups``: :func:`.ways.load_ways`'s,
    ``labels`` their names); empty for one model."""
    first, label = groups[0], labels[0]
    return [
        _pair(first, group, label, other)
        for group, other in zip(groups[1:], labels[1:], strict=True)
    ]
