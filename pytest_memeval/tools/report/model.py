"""What the report pages show, gathered from the runs (the templates lay it out).

The scenario table (one :class:`ScenarioRow` a scenario, its turns side by side) and its
filters, the per-slice comparison, the teacher-forced/free-running section
(:class:`HistorySection`), a run's label when alone, and one run's paired numbers against
the baseline (:class:`PairRow`). Nothing here renders: :mod:`.pages` hands these to
the templates, :mod:`.charts` turns the numbers into chart geometry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

from pytest_memeval.core.free_running import left_truth_words, teacher_forced_beside
from pytest_memeval.core.history import (
    HISTORY_MODEL,
    HISTORY_TRUTH,
    describe_history,
    history_of,
    history_words,
)
from pytest_memeval.core.records import Record
from pytest_memeval.tools.compare import (
    Comparison,
    HistoryPair,
    RunData,
    RunSummary,
    SliceComparison,
    compare_slices,
    fmt_pp,
    fmt_pp_ci,
    format_history_pair,
    history_pair,
    m2_delta_lines,
    run_tags,
)
from pytest_memeval.tools.report.charts import COLORS, DepartureSeries, PositionCurve

__all__ = [
    "FilterOption",
    "HistorySection",
    "PairRow",
    "ScenarioRow",
    "filter_options",
    "history_section",
    "one_label",
    "pair_rows",
    "scenario_rows",
    "slice_comparison",
]


# -- the scenario table ------------------------------------------------------------------------


class TurnCell(TypedDict):
    """One run's turn in a row of the turn table."""

    target: str | None
    pred: str | None
    match: bool | None


class TurnRow(TypedDict):
    """Turn ``k`` of each run (``None`` past a run's last turn); ``diverge``: the targets
    differ between the runs."""

    k: int
    cells: list[TurnCell | None]
    diverge: bool


class FinalCell(TypedDict):
    """One run's final answer to a scenario."""

    match: bool | None
    pred: str | None
    parse_fail: bool


class ScenarioRow(TypedDict):
    """One row of the scenario table; ``classes`` are what the page's filter selects on."""

    sid: str
    classes: list[str]
    structure: str
    truth: str | None
    finals: list[FinalCell]
    turn_counts: str
    prompt_tail: str
    turns: list[TurnRow]


def turns_side_by_side(recs: Sequence[Record]) -> list[TurnRow]:
    """Row k: each run's turn k (``None`` past its last turn); diverge if the targets differ."""
    rows: list[TurnRow] = []
    for k in range(max(len(r["turns"]) for r in recs)):
        cells: list[TurnCell | None] = []
        targets: list[str | None] = []
        for rec in recs:
            if k < len(rec["turns"]):
                t = rec["turns"][k]
                targets.append(t.get("target"))
                cells.append(
                    {"target": t.get("target"), "pred": t.get("pred"), "match": t.get("match")}
                )
            else:
                targets.append(None)
                cells.append(None)
        diverge = len(recs) > 1 and len(set(map(str, targets))) > 1
        rows.append({"k": k, "cells": cells, "diverge": diverge})
    return rows


def scenario_rows(runs: Sequence[RunData], pair: Comparison | None) -> list[ScenarioRow]:
    """One row of the scenario table per scenario, in run A's order (``pair``: A against B,
    when there are two runs)."""
    two = pair is not None
    divergent = set(pair["divergent"]["ids"]) if pair is not None else set()
    fixed = set(pair["flips"]["fixed"]) if pair is not None else set()
    broken = set(pair["flips"]["broken"]) if pair is not None else set()
    rows: list[ScenarioRow] = []
    for sid, rec_a in runs[0].records.items():
        recs = [rec_a] + ([runs[1].records[sid]] if two else [])
        # The classes the page's filter selects on (report.js).
        classes = ["scn"]
        for i, rec in enumerate(recs):
            classes.append(f"{'ab'[i]}-{'right' if rec['final_match'] is True else 'wrong'}")
        classes += [
            name
            for name, ids in (("divergent", divergent), ("fixed", fixed), ("broken", broken))
            if sid in ids
        ]
        rows.append(
            {
                "sid": sid,
                "classes": classes,
                "structure": "divergent" if sid in divergent else ("same structure" if two else ""),
                "truth": rec_a.get("final_gt"),
                "finals": [
                    {
                        "match": rec.get("final_match"),
                        "pred": rec.get("final_pred"),
                        "parse_fail": bool(rec.get("parse_fail")),
                    }
                    for rec in recs
                ],
                "turn_counts": " / ".join(f"{len(rec['turns'])} turns" for rec in recs),
                "prompt_tail": rec_a.get("prompt_tail", ""),
                "turns": turns_side_by_side(recs),
            }
        )
    return rows


class FilterOption(NamedTuple):
    """An option of the scenario table's filter: the row class it selects, and its text."""

    value: str
    text: str


def filter_options(two: bool) -> list[FilterOption]:
    """The scenario table's filter: by A's outcome; with two runs also by B's and the pair's."""
    options = [
        FilterOption("", "all scenarios"),
        FilterOption("a-wrong", "wrong in A"),
        FilterOption("a-right", "right in A"),
    ]
    if two:
        options += [
            FilterOption("b-wrong", "wrong in B"),
            FilterOption("fixed", "fixed (A wrong, B right)"),
            FilterOption("broken", "broken (A right, B wrong)"),
            FilterOption("divergent", "divergent turn structure"),
        ]
    return options


# -- slices, labels, histories ------------------------------------------------------------------


def slice_comparison(
    runs: Sequence[RunData], labels: Sequence[str], slices: Sequence[str], method: str
) -> SliceComparison | None:
    """The per-slice comparison of ``runs[1:]`` against ``runs[0]`` when the runs have tags
    (or slices are asked for: an unknown one is refused with CompareError)."""
    if not slices and not run_tags(*runs):
        return None
    return compare_slices(runs[0], runs[1:], labels, slices=slices, method=method)


def one_label(run: RunData) -> str:
    """A run alone: its checkpoint, and its history when free-running."""
    history = history_of(run.metrics)
    return run.ckpt if history == HISTORY_TRUTH else f"{run.ckpt} ({history_words(history)})"


@dataclass(frozen=True)
class HistorySection:
    """The page's teacher-forced/free-running section.

    ``lines``: its text; ``pair``: the gap between the two histories of one checkpoint (for
    two runs); ``departures``: each run's first departures from the truth (the departure
    chart, when any); ``beside``: the teacher-forced run beside one free-running run (a
    curve for the position chart), when there is one.
    """

    lines: list[str]
    pair: HistoryPair | None
    departures: list[DepartureSeries]
    beside: list[PositionCurve]


def history_section(
    runs: Sequence[RunData], pair: Comparison | None, summaries: Sequence[RunSummary]
) -> HistorySection | None:
    """For a pair of the two histories of one checkpoint, the gap (compare.history);
    for one free-running run, where it left the truth, and its teacher-forced run beside it
    when there is one. ``None`` for teacher-forced runs alone."""
    if pair is not None:
        return _pair_section(runs, pair, summaries)
    run = runs[0]
    if history_of(run.metrics) != HISTORY_MODEL:
        return None
    metrics = run.metrics
    beside = teacher_forced_beside(run.path, metrics)
    left = metrics.get("left_truth")
    lines = [describe_history(HISTORY_MODEL)]
    if left is not None:
        lines.append(left_truth_words(left, metrics["n"]))
    lines.append(beside.note)
    series = (
        [DepartureSeries(summaries[0]["label"], COLORS[0], left, metrics["n"])]
        if left is not None
        else []
    )
    curves: list[PositionCurve] = []
    if beside.metrics is not None:
        tf = beside.metrics
        label = f"{run.ckpt} (teacher-forced)"
        if "left_truth" in tf:
            series.append(DepartureSeries(label, COLORS[1], tf["left_truth"], tf["n"]))
        curves.append({"label": label, "m2_by_position": dict(tf.get("m2_by_position") or {})})
    return HistorySection(lines, None, series, curves)


def _pair_section(
    runs: Sequence[RunData], pair: Comparison, summaries: Sequence[RunSummary]
) -> HistorySection | None:
    """Two runs: the section when they are the two histories of one checkpoint."""
    found = history_pair(runs[0], runs[1], pair)
    if found is None:
        return None
    series = [
        DepartureSeries(s["label"], COLORS[i], left, s["n"])
        for i, s in enumerate(summaries)
        if (left := runs[i].metrics.get("left_truth")) is not None
    ]
    lines = [line.strip() for line in format_history_pair(found, pair["n"])[1:]]
    return HistorySection(lines, found, series, [])


# -- many runs: one run against the baseline ----------------------------------------------------


class PairRow(NamedTuple):
    """A named line of one run's paired numbers against the baseline."""

    name: str
    text: str


def pair_rows(pair: Comparison) -> list[PairRow]:
    """One run against the baseline: its paired numbers, as named rows."""
    mc = pair["mcnemar"]
    return [
        PairRow(
            "m1 delta",
            f"{fmt_pp(pair['m1_delta_pp'])} ({pair['m1_delta_scenarios']:+d} scenarios), 95% CI "
            f"{fmt_pp_ci(pair['m1_delta_ci95_pp'])} (paired, Newcombe)",
        ),
        PairRow(
            "paired test on m1",
            f"exact McNemar: {mc['fixed']} fixed, {mc['broken']} broken; "
            f"{mc['statement']}; Holm-adjusted p = {mc['p_holm']:.4g}",
        ),
        PairRow("power (m1)", pair["m1_power"]["statement"]),
        PairRow("m2", " / ".join(line.strip() for line in m2_delta_lines(pair))),
        PairRow(
            "divergent", f"{pair['divergent']['count']}/{pair['divergent']['total']} scenarios"
        ),
    ]
