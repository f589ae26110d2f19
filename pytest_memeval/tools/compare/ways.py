"""One model measured three ways on the same seeds: teacher-forced, free-running, closed loop.

``memeval compare`` given scenario runs and episode runs together (a ``twc_gold`` benchmark
and the ``env`` table of the same game, fold and seeds: docs/closed-loop.md, "The same seeds,
three ways") sets them side by side. The runs are grouped by model (the ``model`` and
``adapter`` fingerprints); each group is one teacher-forced scenario run, optionally its
free-running run, and one episode run, over the same ids (``twc-<seed>`` on both sides), so
each seed pairs with itself.

For each model: m2 teacher-forced and free-running (the runs' own blocks: intervals clustered
by scenario), the final scene question (m1, teacher-forced; Wilson), and closed-loop success
(Wilson). Then whether per-turn accuracy carries over, seed by seed (:class:`Carryover`):
a seed whose every scored turn was right teacher-forced, against the seed's success in the
environment. By slice (the scenario records' tags): the same numbers over the seeds that
carry the tag.

One consistency check comes with it. A seed whose free-running run reproduced every gold
action saw, in the environment, the same observations after the same actions: the closed loop
held the same conversation and must have succeeded as the gold path did. Where it did not,
the runs were made with different settings (generation, action parsing), and the comparison
says so by id (``free_running_reproduced``).

Nothing here pairs an answer with a success as one outcome: there is no test between the
kinds, only counts set side by side, seed by seed. Between models, each way is tested paired
by seed (:mod:`.ways_pairs`, ``differences``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, TypedDict

from pytest_memeval.core.history import history_of
from pytest_memeval.core.metrics import Tally
from pytest_memeval.core.records import RateBlock, Record
from pytest_memeval.core.slices import SliceError, SliceSpec, select_slices
from pytest_memeval.core.stats import rate_with_ci
from pytest_memeval.core.tags import slice_order
from pytest_memeval.tools.compare.episode_runs import (
    EpisodeRun,
    check_same_env,
    is_episode_run,
    load_episode_run,
)
from pytest_memeval.tools.compare.load import load_run, refuse_different_ids
from pytest_memeval.tools.compare.types import CompareError, RunData
from pytest_memeval.tools.compare.ways_pairs import WaysDifference, WaysGroup, ways_differences

__all__ = [
    "Carryover",
    "ModelWays",
    "Reproduced",
    "SeedRow",
    "SeedWays",
    "WaysComparison",
    "WaysSlice",
    "compare_ways",
    "load_ways",
    "mixes_kinds",
]


class Carryover(TypedDict):
    """Seed by seed: every scored turn right teacher-forced (``turns``) against success."""

    seeds: int
    #: right turn by turn and succeeded / right turn by turn, failed / a wrong turn, succeeded
    #: / a wrong turn, failed
    both: int
    turns_only: int
    success_only: int
    neither: int
    #: (both + neither) / seeds: how often "every turn right" said what the environment did
    agreement: float | None
    turns_only_ids: list[str]
    success_only_ids: list[str]
    #: the mean teacher-forced turn accuracy of the seeds that succeeded, and that failed
    turn_accuracy_of_successes: float | None
    turn_accuracy_of_failures: float | None


class Reproduced(TypedDict):
    """The seeds whose free-running run reproduced every gold action, and how they did."""

    seeds: int
    succeeded: int
    #: reproduced free-running, yet failed in the closed loop: runs of different settings
    failed_ids: list[str]


class ModelWays(TypedDict):
    """One model, three ways."""

    label: str
    teacher_forced: str
    free_running: str | None
    closed_loop: str
    m2_teacher_forced: RateBlock
    m2_free_running: RateBlock | None
    m1: RateBlock
    success: RateBlock
    carryover: Carryover
    free_running_reproduced: Reproduced | None


class WaysSlice(TypedDict):
    """One tag's seeds, per model (in the order of ``models``)."""

    tag: str
    n: int
    models: list[ModelWays]


class SeedWays(TypedDict):
    """One seed, one model: its outcome each way."""

    label: str
    #: teacher-forced: the scored turns and how many were right
    turns_right: int
    turns_scored: int
    #: free-running: null without that run; else whether every gold action was reproduced,
    #: and the first turn that was not (``left_truth_at``)
    free_running_reproduced: bool | None
    free_running_left_at: int | None
    final_match: bool
    success: bool
    reason: str
    steps: int


class SeedRow(TypedDict):
    """One seed (a scenario id and an episode id), every model."""

    id: str
    tags: list[str]
    models: list[SeedWays]


class WaysComparison(TypedDict):
    """What ``memeval compare --json`` prints for runs of both kinds."""

    kind: str
    seeds: int
    models: list[ModelWays]
    slices: list[WaysSlice]
    by_seed: list[SeedRow]
    #: each model after the first against the first, paired by seed (:mod:`.ways_pairs`)
    differences: list[WaysDifference]


def mixes_kinds(paths: Sequence[Path]) -> bool:
    """Whether ``paths`` hold episode runs and scenario runs together."""
    kinds = {is_episode_run(p) for p in paths}
    return kinds == {True, False}


def _model_key(fingerprints: Mapping[str, object]) -> tuple[str, str]:
    return str(fingerprints.get("model")), str(fingerprints.get("adapter"))


def load_ways(paths: Sequence[Path]) -> list[WaysGroup]:
    """Load the runs and group them by model, in the order their first run was given;
    :class:`CompareError` says what does not fit."""
    loops: dict[tuple[str, str], list[EpisodeRun]] = {}
    scenarios: dict[tuple[str, str], list[RunData]] = {}
    order: list[tuple[str, str]] = []
    for path in paths:
        if is_episode_run(path):
            episode_run = load_episode_run(path)
            key = _model_key(episode_run.metrics["fingerprints"])
            loops.setdefault(key, []).append(episode_run)
        else:
            run = load_run(path)
            key = _model_key(run.metrics["fingerprints"])
            scenarios.setdefault(key, []).append(run)
        if key not in order:
            order.append(key)
    groups = [_group(loops.get(key, []), scenarios.get(key, [])) for key in order]
    _check_together(groups)
    return groups


#: what a group of runs must be, said with every refusal of one
_GROUP_RULE = (
    "scenario runs and closed-loop runs given together are set side by side per model (its "
    "model and adapter fingerprints): one teacher-forced run, at most one free-running run "
    "(--memeval-history model) and one closed-loop run of the same seeds"
)


def _group(loops: Sequence[EpisodeRun], scenario_runs: Sequence[RunData]) -> WaysGroup:
    """One model's runs: one episode run, one teacher-forced run, at most one free-running."""
    named = ", ".join([*(str(r.path) for r in loops), *(str(r.path) for r in scenario_runs)])
    by_history: dict[str, list[RunData]] = {}
    for run in scenario_runs:
        by_history.setdefault(history_of(run.metrics), []).append(run)
    truth, model = by_history.get("truth", []), by_history.get("model", [])
    counts = f"{len(truth)} teacher-forced, {len(model)} free-running, {len(loops)} closed-loop"
    if len(loops) != 1 or len(truth) != 1 or len(model) > 1:
        raise CompareError(f"the runs of one model ({named}) are {counts}: {_GROUP_RULE}")
    tf, fr = truth[0], (model[0] if model else None)
    closed = loops[0]
    refuse_different_ids(
        list(tf.records), list(closed.records), str(tf.path), str(closed.path), "seeds"
    )
    if fr is not None:
        _refuse_other_benchmark(tf, fr)
        refuse_different_ids(
            list(tf.records), list(fr.records), str(tf.path), str(fr.path), "seeds"
        )
    return {"teacher_forced": tf, "free_running": fr, "closed_loop": closed}


def _refuse_other_benchmark(a: RunData, b: RunData) -> None:
    if a.metrics["fingerprints"].get("benchmark") != b.metrics["fingerprints"].get("benchmark"):
        raise CompareError(f"{a.path} and {b.path} evaluate different benchmarks")


def _check_together(groups: Sequence[WaysGroup]) -> None:
    """Every model on the same seeds, the same benchmark and the same environment."""
    first = groups[0]
    for group in groups[1:]:
        a, b = first["teacher_forced"], group["teacher_forced"]
        _refuse_other_benchmark(a, b)
        refuse_different_ids(list(a.records), list(b.records), str(a.path), str(b.path), "seeds")
        check_same_env(
            first["closed_loop"].metrics["env"],
            group["closed_loop"].metrics["env"],
            str(first["closed_loop"].path),
            str(group["closed_loop"].path),
        )


def _scored(record: Record) -> list[bool]:
    """Whether each scored turn of ``record`` matched (unscored, unaligned turns left out)."""
    return [bool(t["match"]) for t in record["turns"] if t["match"] is not None]


def _turn_accuracy(record: Record) -> float | None:
    """The share of the record's scored turns that matched; ``None`` without one."""
    scored = _scored(record)
    return sum(scored) / len(scored) if scored else None


def _reproduced_gold(record: Record) -> bool:
    """A free-running record that never left the truth: every turn was the gold message. A
    record written before ``left_truth_at`` existed says nothing, and counts as not."""
    return "left_truth_at" in record and record["left_truth_at"] is None


def _carryover(tf: RunData, loop: EpisodeRun, ids: Sequence[str]) -> Carryover:
    cells: dict[tuple[bool, bool], list[str]] = {}
    of_successes: list[float] = []
    of_failures: list[float] = []
    for scenario_id in ids:
        accuracy = _turn_accuracy(tf.records[scenario_id])
        success = loop.records[scenario_id]["success"]
        cells.setdefault((accuracy == 1.0, success), []).append(scenario_id)
        if accuracy is not None:
            (of_successes if success else of_failures).append(accuracy)
    both, neither = cells.get((True, True), []), cells.get((False, False), [])
    return {
        "seeds": len(ids),
        "both": len(both),
        "turns_only": len(cells.get((True, False), [])),
        "success_only": len(cells.get((False, True), [])),
        "neither": len(neither),
        "agreement": (len(both) + len(neither)) / len(ids) if ids else None,
        "turns_only_ids": cells.get((True, False), []),
        "success_only_ids": cells.get((False, True), []),
        "turn_accuracy_of_successes": _mean(of_successes),
        "turn_accuracy_of_failures": _mean(of_failures),
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _reproduced(fr: RunData, loop: EpisodeRun, ids: Sequence[str]) -> Reproduced:
    reproduced = [i for i in ids if _reproduced_gold(fr.records[i])]
    failed = [i for i in reproduced if not loop.records[i]["success"]]
    return {
        "seeds": len(reproduced),
        "succeeded": len(reproduced) - len(failed),
        "failed_ids": failed,
    }


def _ways(group: WaysGroup, label: str, ids: Sequence[str], spec: SliceSpec | None) -> ModelWays:
    """One model's numbers over ``ids``: the whole run's (``spec`` None) or a slice's, whose
    m1 and m2 blocks are counted from its records as the run counts its own (``Tally``)."""
    tf, fr, loop = group["teacher_forced"], group["free_running"], group["closed_loop"]

    def m_block(run: RunData, which: Literal["m1", "m2"]) -> RateBlock:
        if spec is None:
            return run.metrics[which]
        return Tally().extend(run.records[i] for i in ids).counts()[which]

    successes = sum(loop.records[i]["success"] for i in ids)
    return {
        "label": label,
        "teacher_forced": str(tf.path),
        "free_running": None if fr is None else str(fr.path),
        "closed_loop": str(loop.path),
        "m2_teacher_forced": m_block(tf, "m2"),
        "m2_free_running": None if fr is None else m_block(fr, "m2"),
        "m1": m_block(tf, "m1"),
        "success": rate_with_ci(successes, len(ids)),
        "carryover": _carryover(tf, loop, ids),
        "free_running_reproduced": None if fr is None else _reproduced(fr, loop, ids),
    }


def _slice_tags(run: RunData, ids: Sequence[str]) -> list[str]:
    """The tags that split the seeds (a tag on every seed is the whole table again); every
    run of one benchmark has the same tags, so one run's are read."""
    counts: dict[str, int] = {}
    for scenario_id in ids:
        for tag in run.records[scenario_id].get("tags", []):
            counts[tag] = counts.get(tag, 0) + 1
    return [t for t in slice_order(counts) if counts[t] < len(ids)]


def _labels(groups: Sequence[WaysGroup]) -> list[str]:
    """Each model's name: its closed-loop run's profile, or where two are alike, the run's
    directory with its parent."""
    names = [g["closed_loop"].ckpt for g in groups]
    if len(set(names)) == len(names):
        return names
    return [f"{g['closed_loop'].path.parent.name}/{g['closed_loop'].path.name}" for g in groups]


def _slice_specs(run: RunData, ids: Sequence[str], shown: Sequence[str]) -> list[SliceSpec]:
    """The slices to show: what the expressions name (``memeval compare --slice``: a tag, a
    glob, ``TAG&TAG``, as every comparison reads them), or every tag that splits the seeds;
    :class:`CompareError` for an expression that names no slice of these seeds."""
    if not shown:
        return [SliceSpec((tag,)) for tag in _slice_tags(run, ids)]
    known = slice_order(t for i in ids for t in run.records[i].get("tags", []))
    try:
        return select_slices(shown, known)
    except SliceError as exc:
        raise CompareError(str(exc)) from None


def compare_ways(groups: Sequence[WaysGroup], slices_shown: Sequence[str] = ()) -> WaysComparison:
    """The three ways of each model side by side, whole and by slice (``slices_shown``: slice
    expressions, ``memeval compare --slice``; default every tag that splits the seeds)."""
    first = groups[0]["teacher_forced"]
    ids = list(first.records)
    labels = _labels(groups)
    models = [_ways(g, label, ids, None) for g, label in zip(groups, labels, strict=True)]
    slices: list[WaysSlice] = []
    for spec in _slice_specs(first, ids, slices_shown):
        tagged = [i for i in ids if spec.holds(first.records[i].get("tags", []))]
        if not tagged:
            raise CompareError(f"slice {spec.name!r}: no seed carries all of its tags")
        slices.append(
            {
                "tag": spec.name,
                "n": len(tagged),
                "models": [
                    _ways(g, label, tagged, spec) for g, label in zip(groups, labels, strict=True)
                ],
            }
        )
    by_seed: list[SeedRow] = [
        {
            "id": scenario_id,
            "tags": list(groups[0]["teacher_forced"].records[scenario_id].get("tags", [])),
            "models": [
                _seed(g, label, scenario_id) for g, label in zip(groups, labels, strict=True)
            ],
        }
        for scenario_id in ids
    ]
    return {
        "kind": "ways",
        "seeds": len(ids),
        "models": models,
        "slices": slices,
        "by_seed": by_seed,
        "differences": ways_differences(groups, labels),
    }


def _seed(group: WaysGroup, label: str, scenario_id: str) -> SeedWays:
    tf, fr, loop = group["teacher_forced"], group["free_running"], group["closed_loop"]
    record = tf.records[scenario_id]
    scored = _scored(record)
    episode = loop.records[scenario_id]
    free = None if fr is None else fr.records[scenario_id]
    return {
        "label": label,
        "turns_right": sum(scored),
        "turns_scored": len(scored),
        "free_running_reproduced": None if free is None else _reproduced_gold(free),
        "free_running_left_at": None if free is None else free.get("left_truth_at"),
        "final_match": record["final_match"],
        "success": episode["success"],
        "reason": episode["reason"],
        "steps": episode["steps"],
    }
