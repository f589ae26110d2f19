"""The ``memeval report`` pages, rendered: one run or two (A, B), or several against one.

:func:`render_report` and :func:`render_many` gather each page's data
(:mod:`.model`), lay out its charts (:mod:`.charts`) and render its template
(``one_or_two.html``, ``many.html``; autoescaped, :mod:`.templating`) into one
self-contained page whose Content-Security-Policy allows only its own inline script (by
hash) and style.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
from collections.abc import Sequence
from typing import TypedDict

from pytest_memeval.tools.compare import (
    HistoryPair,
    RunData,
    compare_many,
    compare_runs,
    m2_delta_lines,
    run_summary,
)
from pytest_memeval.tools.report.charts import (
    COLORS,
    DepartureChart,
    PositionCurve,
    departure_chart,
    forest_plot,
    interval_chart,
    position_chart,
)
from pytest_memeval.tools.report.model import (
    HistorySection,
    filter_options,
    history_section,
    one_label,
    pair_rows,
    scenario_rows,
    slice_comparison,
)
from pytest_memeval.tools.report.templating import render, static_text

__all__ = ["generated_at", "page_csp", "render_many", "render_report"]

LETTERS = ("A", "B")


def page_csp(script: str | None) -> str:
    """The page's Content-Security-Policy: nothing from outside; our inline script by hash."""
    policy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    if script is None:
        return policy
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"{policy}; script-src 'sha256-{digest}'"


def generated_at() -> str:
    """The page's time stamp: now, in UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class HistoriesBlock(TypedDict, total=False):
    """``histories`` of ``one_or_two.html``: empty when the page has no such section."""

    lines: list[str]
    pair: HistoryPair | None
    departures: DepartureChart | None


def _histories_block(section: HistorySection | None) -> HistoriesBlock:
    if section is None:
        return {}
    return {
        "lines": section.lines,
        "pair": section.pair,
        "departures": departure_chart(section.departures) if section.departures else None,
    }


def render_report(
    runs: Sequence[RunData], *, slices: Sequence[str] = (), method: str = "holm"
) -> str:
    """The page for one run or two (A, B); raises CompareError if two are not comparable.

    With two runs whose scenarios carry tags, the page compares them slice by slice
    (``slices``: which, default all; ``method``: the correction); one run shows its own
    ``slices`` block.
    """
    if len(runs) not in (1, 2):
        raise ValueError("render_report takes one or two runs")
    two = len(runs) == 2
    pair = compare_runs(runs[0], runs[1]) if two else None
    by_slice = (
        slice_comparison(runs, [pair["a"]["label"], pair["b"]["label"]], slices, method)
        if pair is not None
        else None
    )
    # One run: the same summary fields, no pairing.
    summaries = (
        [pair["a"], pair["b"]] if pair is not None else [run_summary(one_label(runs[0]), runs[0])]
    )
    section = history_section(runs, pair, summaries)
    curves: list[PositionCurve] = [*summaries, *(section.beside if section else [])]
    return render(
        "one_or_two.html",
        title="memeval report: " + " vs ".join(s["label"] for s in summaries),
        csp=page_csp(static_text("report.js")),
        generated=generated_at(),
        n=pair["n"] if pair is not None else runs[0].metrics["n"],
        notes=pair["notes"] if pair is not None else [],
        letters=LETTERS[: len(runs)],
        summaries=[dict(s, color=COLORS[i], letter=LETTERS[i]) for i, s in enumerate(summaries)],
        paired=pair,
        slices=by_slice,
        run_slices_block={} if two else (runs[0].metrics.get("slices") or {}),
        m2_lines=[line.strip() for line in m2_delta_lines(pair)] if pair is not None else [],
        charts=[
            interval_chart("m1 final-query, 95% Wilson interval", summaries, "m1"),
            interval_chart("m2 turn-level, 95% interval clustered by scenario", summaries, "m2"),
        ],
        position=position_chart(curves),
        histories=_histories_block(section),
        filters=filter_options(two),
        scenarios=scenario_rows(runs, pair),
    )


def render_many(
    baseline: RunData, runs: Sequence[RunData], *, slices: Sequence[str] = (), method: str = "holm"
) -> str:
    """One page for several runs against a baseline: the leaderboard, a forest plot of the
    m1 deltas with their paired intervals, each run by slice (one family over every run and
    slice) when the runs have tags, and each run's numbers and flips on demand."""
    result = compare_many(baseline, runs)
    labels = [result["baseline"]["label"], *(p["b"]["label"] for p in result["runs"])]
    return render(
        "many.html",
        title=f"memeval report: {len(runs)} runs against {result['baseline']['label']}",
        csp=page_csp(None),  # no script on this page
        generated=generated_at(),
        n=result["n"],
        leaderboard=result["leaderboard"],
        forest=forest_plot(result),
        pairs=[{"pair": pair, "rows": pair_rows(pair)} for pair in result["runs"]],
        slices=slice_comparison([baseline, *runs], labels, slices, method),
    )
