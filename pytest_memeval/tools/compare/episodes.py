"""Two closed-loop runs compared, paired by episode: ``memeval compare`` on episode runs.

Each run: success (successes over the episodes, with the 95% Wilson interval), mean score,
mean steps (over every episode and over the successful ones), the invalid-action rate. The
pair: the success difference in percentage points with its paired interval (Newcombe), the
exact McNemar test on the episodes whose outcome differs
(:func:`~pytest_memeval.tools.compare.stats.mcnemar`), the smallest difference the pair could
detect, and the flipped episodes by id (fixed: failed in A, succeeded in B; broken: the
reverse). By slice (an episode's tags): the same per slice, every slice's p-value adjusted
over the slices shown as one family (Holm or Benjamini-Hochberg, as the scenario comparison,
:mod:`~pytest_memeval.tools.compare.slices`). By default the slices shown are the tags that
split the episodes: a tag every episode carries (the environment's ``game:``, ``fold:`` and
parameters) is the whole run again. Runs are loaded and refused by
:mod:`~pytest_memeval.tools.compare.episode_runs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from pytest_memeval.core.records import RateBlock
from pytest_memeval.core.slices import SliceSpec, select_slices
from pytest_memeval.core.stats import (
    CORRECTIONS,
    adjust_p,
    mde_paired_binary,
    min_detectable_drop,
    normal_quantile,
    paired_diff_interval,
    rate_with_ci,
)
from pytest_memeval.core.tags import slice_order
from pytest_memeval.tools.compare.episode_runs import (
    EpisodeRun,
    check_same_env,
    check_same_episodes,
    env_notes,
)
from pytest_memeval.tools.compare.stats import m1_delta_interval, mcnemar
from pytest_memeval.tools.compare.types import ALPHA, POWER, CompareError, Flips, McNemar

__all__ = [
    "EpisodeComparison",
    "EpisodeRunSummary",
    "EpisodeSliceRow",
    "EpisodeSlices",
    "compare_episode_runs",
]

#: the McNemar test as an episode comparison states it
TEST_WORDS = "exact McNemar (two-sided binomial on discordant episodes)"


class EpisodeRunSummary(TypedDict):
    """One run of an episode comparison."""

    label: str
    path: str
    ckpt: str
    episodes: int
    success: RateBlock
    mean_score: float | None
    mean_steps: float | None
    mean_steps_successful: float | None
    invalid_action_rate: float | None
    fingerprints: dict[str, Any]


class EpisodeSliceRow(TypedDict):
    """One slice of the pair: its episodes' success in each run and the paired test."""

    slice: str
    n: int
    a: RateBlock
    b: RateBlock
    delta_pp: float | None
    delta_ci_pp: list[float] | None
    fixed: int
    broken: int
    p_value: float
    p_adjusted: float
    significant: bool
    verdict: str


class EpisodeSlices(TypedDict):
    """The per-slice comparison: one family of p-values, adjusted with ``method``."""

    method: str
    controls: str
    alpha: float
    tests: int
    ci_level: float
    #: tags every episode carries, not shown by default (each is the whole run again)
    whole_run_tags: list[str]
    rows: list[EpisodeSliceRow]


class EpisodeComparison(TypedDict):
    """Two episode runs compared (what ``memeval compare --json`` prints for them)."""

    kind: str
    a: EpisodeRunSummary
    b: EpisodeRunSummary
    n: int
    env: dict[str, Any]
    notes: list[str]
    success_delta_pp: float | None
    success_delta_episodes: int
    success_delta_ci95_pp: list[float] | None
    success_delta_ci95_method: str
    mean_score_delta: float | None
    mean_steps_delta: float | None
    mcnemar: McNemar
    mde_pp: float | None
    mde_basis: str
    flips: Flips
    slices: EpisodeSlices


def _summary(label: str, run: EpisodeRun) -> EpisodeRunSummary:
    numbers = run.metrics["episodes"]
    success = numbers["success"]
    return {
        "label": label,
        "path": str(run.path),
        "ckpt": run.ckpt,
        "episodes": numbers["episodes"],
        "success": rate_with_ci(success["correct"], success["total"]),
        "mean_score": numbers["mean_score"],
        "mean_steps": numbers["steps"]["mean"],
        "mean_steps_successful": numbers["steps"]["mean_successful"],
        "invalid_action_rate": numbers["invalid_actions"]["rate"],
        "fingerprints": dict(run.metrics.get("fingerprints") or {}),
    }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _mde(n: int, discordant: int, alpha: float) -> tuple[float | None, str]:
    """Connor's minimum detectable success difference (pp) at ``alpha`` and its basis: at
    the observed share of changed episodes, else the best case (every change one way)."""
    if discordant:
        mde = mde_paired_binary(n, discordant / n, alpha, POWER)
        if mde is not None:
            return mde * 100, "observed discordant share"
    best = min_detectable_drop(n, alpha, POWER)
    return (None if best is None else best * 100), "best case: every change in one direction"


def _labels(run_a: EpisodeRun, run_b: EpisodeRun) -> tuple[str, str]:
    if run_a.ckpt != run_b.ckpt:
        return run_a.ckpt, run_b.ckpt
    return str(run_a.path), str(run_b.path)


def _slice_row(run_a: EpisodeRun, run_b: EpisodeRun, spec: SliceSpec) -> EpisodeSliceRow:
    members = [
        i
        for i in run_a.records
        if spec.holds({*run_a.records[i]["tags"], *run_b.records[i]["tags"]})
    ]
    ok_a = [run_a.records[i]["success"] for i in members]
    ok_b = [run_b.records[i]["success"] for i in members]
    fixed = sum(b and not a for a, b in zip(ok_a, ok_b, strict=True))
    broken = sum(a and not b for a, b in zip(ok_a, ok_b, strict=True))
    n = len(members)
    return {
        "slice": spec.name,
        "n": n,
        "a": rate_with_ci(sum(ok_a), n),
        "b": rate_with_ci(sum(ok_b), n),
        "delta_pp": (sum(ok_b) - sum(ok_a)) / n * 100 if n else None,
        "delta_ci_pp": None,
        "fixed": fixed,
        "broken": broken,
        "p_value": mcnemar(fixed, broken)["p_value"],
        "p_adjusted": 1.0,
        "significant": False,
        "verdict": "",
    }


def _verdict(row: EpisodeSliceRow, tests: int) -> str:
    delta = row["delta_pp"]
    if row["significant"] and delta is not None:
        word = "drop" if delta < 0 else "gain"
        return f"success {word} of {abs(delta):.1f} pp, adjusted p={row['p_adjusted']:.2g}"
    text = f"no detectable difference at n={row['n']}"
    if row["p_value"] < ALPHA:
        return (
            f"{text}: significant alone, not after correcting for {tests} tests (raw "
            f"p={row['p_value']:.2g}, adjusted {row['p_adjusted']:.2g})"
        )
    return text


def _compare_slices(
    run_a: EpisodeRun, run_b: EpisodeRun, expressions: Sequence[str], method: str
) -> EpisodeSlices:
    if method not in CORRECTIONS:
        raise CompareError(f"unknown correction {method!r} (one of {', '.join(CORRECTIONS)})")
    records = [*run_a.records.values(), *run_b.records.values()]
    known = slice_order(t for r in records for t in r["tags"])
    whole = [t for t in known if all(t in r["tags"] for r in records)]
    try:
        specs = select_slices(expressions, known)
    except ValueError as exc:
        raise CompareError(str(exc)) from None
    if not expressions:
        specs = [s for s in specs if s.name not in whole]
    rows = [_slice_row(run_a, run_b, spec) for spec in specs]
    for row in rows:
        if not row["n"]:
            raise CompareError(f"slice {row['slice']!r}: no episode carries all of its tags")
    adjusted = adjust_p([row["p_value"] for row in rows], method)
    level = ALPHA / max(1, len(rows))
    z = normal_quantile(1 - level / 2)
    for row, adj in zip(rows, adjusted, strict=True):
        row["p_adjusted"] = adj
        row["significant"] = adj < ALPHA
        both = row["a"]["correct"] - row["broken"]
        neither = row["n"] - both - row["fixed"] - row["broken"]
        low, high = paired_diff_interval(both, row["fixed"], row["broken"], neither, z)
        row["delta_ci_pp"] = [low * 100, high * 100]
        row["verdict"] = _verdict(row, len(rows))
    return {
        "method": method,
        "controls": CORRECTIONS[method][1],
        "alpha": ALPHA,
        "tests": len(rows),
        "ci_level": 1 - level,
        "whole_run_tags": whole,
        "rows": rows,
    }


def compare_episode_runs(
    run_a: EpisodeRun,
    run_b: EpisodeRun,
    *,
    slices: Sequence[str] = (),
    method: str = "holm",
) -> EpisodeComparison:
    """Run B (the candidate) against run A (the reference), paired by episode id.

    Raises :class:`CompareError` for runs of different environments or seeds, and for a
    slice expression that names no slice. ``slices``: slice expressions (default: every tag
    that splits the episodes); ``method``: ``holm`` or ``bh``.
    """
    label_a, label_b = _labels(run_a, run_b)
    env_a, env_b = run_a.metrics["env"], run_b.metrics["env"]
    check_same_env(env_a, env_b, f"A ({run_a.path})", f"B ({run_b.path})")
    check_same_episodes(
        list(run_a.records), list(run_b.records), f"A ({run_a.path})", f"B ({run_b.path})"
    )
    ids = list(run_a.records)
    fixed = [i for i in ids if run_b.records[i]["success"] and not run_a.records[i]["success"]]
    broken = [i for i in ids if run_a.records[i]["success"] and not run_b.records[i]["success"]]
    a, b = _summary(label_a, run_a), _summary(label_b, run_b)
    n = len(ids)
    right_a = a["success"]["correct"]
    test = mcnemar(len(fixed), len(broken))
    test["test"] = TEST_WORDS
    mde_pp, basis = _mde(n, len(fixed) + len(broken), ALPHA)
    return {
        "kind": "episodes",
        "a": a,
        "b": b,
        "n": n,
        "env": {k: v for k, v in env_a.items() if k != "seeds"},
        "notes": env_notes(env_a, env_b),
        "success_delta_pp": (len(fixed) - len(broken)) / n * 100 if n else None,
        "success_delta_episodes": len(fixed) - len(broken),
        "success_delta_ci95_pp": m1_delta_interval(n, right_a, len(fixed), len(broken)),
        "success_delta_ci95_method": "paired, Newcombe",
        "mean_score_delta": _delta(a["mean_score"], b["mean_score"]),
        "mean_steps_delta": _delta(a["mean_steps"], b["mean_steps"]),
        "mcnemar": test,
        "mde_pp": mde_pp,
        "mde_basis": basis,
        "flips": {"fixed": fixed, "broken": broken},
        "slices": _compare_slices(run_a, run_b, slices, method),
    }
