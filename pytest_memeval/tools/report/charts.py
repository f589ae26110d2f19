"""The report's inline SVG charts as geometry: numbers that ``templates/_charts.html`` draws.

Each function takes what a chart shows and returns its layout (sizes, axis ticks, one row,
line or bar per run) as a typed dict the chart's macro reads by name; every text on a chart
(run labels, titles) is printed by the template, through autoescape. ``COLORS`` are the two
runs' colours (A, B) wherever the pages draw runs side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, TypedDict

from pytest_memeval.core.records import LeftTruth, PositionCounts, RateBlock
from pytest_memeval.tools.compare import ManyComparison, RunSummary

__all__ = [
    "COLORS",
    "DepartureChart",
    "DepartureSeries",
    "ForestPlot",
    "IntervalChart",
    "PositionChart",
    "PositionCurve",
    "departure_chart",
    "forest_plot",
    "interval_chart",
    "position_chart",
]

COLORS = ("#1f6fb4", "#d9480f")  # run A, run B


class Tick(TypedDict):
    """A labelled tick on a horizontal axis."""

    x: float
    label: str


class GridLine(TypedDict):
    """A labelled horizontal grid line."""

    y: float
    label: str


# -- m1 / m2 with their intervals --------------------------------------------------------------


class _IntervalRowFields(TypedDict):
    y: float
    label: str
    color: str
    block: RateBlock


class IntervalRow(_IntervalRowFields, total=False):
    """One run of an interval chart; the interval's ends and their x where it has a rate."""

    lo: float
    hi: float
    x_lo: float
    x_hi: float
    x_rate: float


class RunRowsFrame(TypedDict):
    """The frame of a chart with a row per run: size, margins, the x axis's height."""

    width: int
    height: int
    left: int
    right: int
    top: int
    axis_y: int


class IntervalChart(RunRowsFrame):
    """Dot (rate) and whisker (95% interval) per run, on a labelled percent axis."""

    title: str
    key: str
    ticks: list[Tick]
    rows: list[IntervalRow]


def interval_chart(
    title: str, runs: Sequence[RunSummary], key: Literal["m1", "m2"]
) -> IntervalChart:
    """Dot (rate) and whisker (95% interval) per run, on a labelled percent axis."""
    width, left, right, row_h, top = 560, 120, 150, 34, 26
    lows = [ci[0] for r in runs if (ci := r[key].get("ci95")) is not None]
    lo_axis = 0.0
    if lows and min(lows) > 0.5:
        # Zoom to where the data is, in 10-point steps; the ticks say where the axis starts.
        lo_axis = max(0.0, int((min(lows) - 0.02) * 10) / 10)
    span = 1.0 - lo_axis
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + (v - lo_axis) / span * plot_w

    rows = []
    for i, run in enumerate(runs):
        block = run[key]
        row: IntervalRow = {
            "y": top + row_h * i + row_h / 2,
            "label": run["label"],
            "color": COLORS[i % len(COLORS)],
            "block": block,
        }
        rate, ci = block["rate"], block.get("ci95")
        if rate is not None and ci is not None:  # run_summary: an interval wherever a rate
            lo, hi = ci
            row.update({"lo": lo, "hi": hi, "x_lo": x(lo), "x_hi": x(hi), "x_rate": x(rate)})
        rows.append(row)
    ticks = [lo_axis + span * i / 5 for i in range(6)]
    return {
        "title": title,
        "key": key,
        "width": width,
        "height": top + row_h * len(runs) + 28,
        "left": left,
        "right": right,
        "top": top,
        "axis_y": top + row_h * len(runs),
        "ticks": [{"x": x(t), "label": f"{t * 100:.0f}%"} for t in ticks],
        "rows": rows,
    }


# -- m2 by turn position -----------------------------------------------------------------------


class PositionCurve(TypedDict):
    """What the position chart draws of a run: a run summary, or the teacher-forced run
    beside a free-running one."""

    label: str
    m2_by_position: dict[str, PositionCounts]


class PositionTick(TypedDict):
    """A turn position on the horizontal axis."""

    x: float
    label: int


class PositionPoint(TypedDict):
    """m2 at one turn position of one run."""

    pos: int
    correct: int
    total: int
    x: float
    y: float


class PositionSeries(TypedDict):
    """One run's line."""

    label: str
    color: str
    points: list[PositionPoint]


class TurnAxisFrame(TypedDict):
    """The frame of a chart over turn positions: size, margins, the x axis's label, the
    horizontal grid."""

    width: int
    height: int
    left: int
    right: int
    bottom: int
    axis_label_x: float
    grid: list[GridLine]


class PositionChart(TurnAxisFrame):
    """m2 by turn position: one line per run, y from 0 to 100%."""

    ticks: list[PositionTick]
    series: list[PositionSeries]


class _Point(NamedTuple):
    pos: int
    correct: int
    total: int


def position_chart(runs: Sequence[PositionCurve]) -> PositionChart:
    """m2 by turn position: one line per run, y from 0 to 100%."""
    series = []
    for run in runs:
        points = []
        for pos, slot in sorted(run["m2_by_position"].items(), key=lambda kv: int(kv[0])):
            if slot["total"]:
                points.append(_Point(int(pos), slot["correct"], slot["total"]))
        series.append(points)
    max_pos = max((p.pos for pts in series for p in pts), default=0)
    width, height, left, right, top, bottom = 560, 240, 46, 16, 14, 36
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(pos: int) -> float:
        return left + (pos / max_pos * plot_w if max_pos else plot_w / 2)

    def y(rate: float) -> float:
        return top + (1 - rate) * plot_h

    step = max(1, (max_pos + 1) // 10)
    return {
        "width": width,
        "height": height,
        "left": left,
        "right": right,
        "bottom": bottom,
        "axis_label_x": left + plot_w / 2,
        "grid": [{"y": y(f), "label": f"{f * 100:.0f}%"} for f in (0, 0.25, 0.5, 0.75, 1)],
        "ticks": [{"x": x(pos), "label": pos} for pos in range(0, max_pos + 1, step)],
        "series": [
            {
                "label": run["label"],
                "color": COLORS[i % len(COLORS)],
                "points": [
                    {
                        "pos": p.pos,
                        "correct": p.correct,
                        "total": p.total,
                        "x": x(p.pos),
                        "y": y(p.correct / p.total),
                    }
                    for p in pts
                ],
            }
            for i, (run, pts) in enumerate(zip(runs, series, strict=True))
        ],
    }


# -- where the scenarios first left the truth --------------------------------------------------


class DepartureSeries(NamedTuple):
    """One run of the departure chart: its ``left_truth`` over its ``n`` scenarios."""

    label: str
    color: str
    left: LeftTruth
    n: int


class DepartureBar(TypedDict):
    """One run's share of scenarios at one turn position (or "never")."""

    x: float
    y: float
    w: float
    h: float
    color: str
    title: str


class SeriesKey(TypedDict):
    """A run's entry in a chart's legend."""

    label: str
    color: str


class DepartureChart(TurnAxisFrame):
    """Per turn position (and "never"), a bar per run of the share of its scenarios."""

    ticks: list[Tick]
    bars: list[DepartureBar]
    series: list[SeriesKey]


def departure_chart(series: Sequence[DepartureSeries]) -> DepartureChart:
    """Where the scenarios first left the truth: per turn position (and "never"), a bar per
    run of the share of its ``n`` scenarios."""
    top = max((int(k) for s in series for k in s.left["at"]), default=0)
    slots = [str(k) for k in range(top + 1)] + ["never"]
    width, height, left_m, right_m, top_m, bottom = 560, 220, 46, 16, 14, 36
    plot_w, plot_h = width - left_m - right_m, height - top_m - bottom
    slot_w = plot_w / len(slots)
    bar_w = max(1.0, slot_w * 0.8 / max(1, len(series)))
    peak = max(
        [count / s.n for s in series if s.n for count in (*s.left["at"].values(), s.left["never"])]
        or [1.0]
    )
    scale = max(0.1, peak)

    def y(share: float) -> float:
        return top_m + (1 - share / scale) * plot_h

    bars: list[DepartureBar] = []
    for i, run in enumerate(series):
        for j, slot in enumerate(slots):
            count = run.left["never"] if slot == "never" else run.left["at"].get(slot, 0)
            if not count or not run.n:
                continue
            share = count / run.n
            bars.append(
                {
                    "x": left_m + j * slot_w + slot_w * 0.1 + i * bar_w,
                    "y": y(share),
                    "w": bar_w,
                    "h": top_m + plot_h - y(share),
                    "color": run.color,
                    "title": f"{run.label}: {count}/{run.n} scenarios first left the truth "
                    + ("never" if slot == "never" else f"at turn {slot}"),
                }
            )
    step = max(1, len(slots) // 10)
    return {
        "width": width,
        "height": height,
        "left": left_m,
        "right": right_m,
        "bottom": bottom,
        "axis_label_x": left_m + plot_w / 2,
        "grid": [{"y": y(f * scale), "label": f"{f * scale * 100:.0f}%"} for f in (0, 0.5, 1)],
        "ticks": [
            {"x": left_m + j * slot_w + slot_w / 2, "label": slot}
            for j, slot in enumerate(slots)
            if slot == "never" or j % step == 0
        ],
        "bars": bars,
        "series": [{"label": s.label, "color": s.color} for s in series],
    }


# -- many runs: the m1 deltas against the baseline ---------------------------------------------


class ForestTick(Tick):
    """A tick of the pp axis; the line through 0 is darker."""

    stroke: str


class _ForestRowFields(TypedDict):
    y: float
    label: str
    color: str
    delta: float
    ci: list[float] | None
    p_holm: float
    x_delta: float


class ForestRow(_ForestRowFields, total=False):
    """One run against the baseline; the interval's x where it has one."""

    x_lo: float
    x_hi: float


class ForestPlot(RunRowsFrame):
    """m1 delta per run with its paired 95% interval, on a pp axis through 0."""

    axis_label_x: float
    ticks: list[ForestTick]
    rows: list[ForestRow]


def forest_plot(result: ManyComparison) -> ForestPlot:
    """m1 delta (run - baseline) per run with its paired 95% interval, on a pp axis through 0.

    Runs without a delta (no scenario: no rate) have no row.
    """
    runs = [
        (r, delta)
        for r in result["leaderboard"]
        if not r["baseline"] and (delta := r.get("m1_delta_pp")) is not None
    ]
    bounds = [0.0]
    for r, delta in runs:
        bounds.append(delta)
        if r["m1_delta_ci95_pp"] is not None:
            bounds += list(r["m1_delta_ci95_pp"])
    reach = max(1.0, max(abs(b) for b in bounds))
    step = next(t for t in (0.5, 1, 2, 5, 10, 20, 25, 50) if reach / t <= 5)
    reach = step * -(-reach // step)
    width, left, right, row_h, top = 720, 200, 230, 30, 26
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + (v + reach) / (2 * reach) * plot_w

    axis_y = top + row_h * len(runs)
    ticks = [-reach + i * step for i in range(int(2 * reach / step) + 1)]
    rows = []
    for i, (r, delta) in enumerate(runs):
        ci = r["m1_delta_ci95_pp"]
        row: ForestRow = {
            "y": top + row_h * i + row_h / 2,
            "label": r["label"],
            "color": COLORS[1] if r["m1_p_holm"] < 0.05 else COLORS[0],
            "delta": delta,
            "ci": ci,
            "p_holm": r["m1_p_holm"],
            "x_delta": x(delta),
        }
        if ci is not None:
            row.update({"x_lo": x(ci[0]), "x_hi": x(ci[1])})
        rows.append(row)
    return {
        "width": width,
        "height": axis_y + 34,
        "left": left,
        "right": right,
        "top": top,
        "axis_y": axis_y,
        "axis_label_x": left + plot_w / 2,
        "ticks": [
            {
                "x": x(t),
                "label": f"{t:+g}" if t else "0",
                "stroke": "#77808b" if t == 0 else "#e3e6ea",
            }
            for t in ticks
        ],
        "rows": rows,
    }
