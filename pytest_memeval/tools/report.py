"""``memeval report RUN [RUN_B ...] -o report.html``: one self-contained HTML page.

With more than two runs, the page compares each with the first (the baseline): a
leaderboard, a forest plot of the m1 deltas with their paired intervals, and each run's
numbers and flipped scenarios on demand (``<details>``). With one or two, as follows.

The page holds the comparison table (m1/m2 with 95% Wilson intervals, unaligned, parse
failures, delta, divergent, the McNemar verdict), the flipped scenarios, inline SVG charts
(m1 and m2 with their intervals; m2 by turn position for each run) and a searchable table of
every scenario with its turns side by side. It loads nothing: no network, no CDN, one file
whose Content-Security-Policy allows only its own inline script (by hash) and style.

The markup lives in Jinja2 templates (``tools/templates/``), the stylesheet and the script in
``tools/static/`` (inlined: the page stays one file); this module computes what they show. The
templates are autoescaped (:mod:`pytest_memeval.tools.templating`): all benchmark and model
text is printed as text, so a prediction that contains ``<script>`` is shown as those
characters and never runs. The renderers for pytest-html's summary and per-scenario extra
(:mod:`pytest_memeval.tools.html_extras`) live here too.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_memeval.core.free_running import (
    left_truth_words,
    position_table,
    teacher_forced_beside,
)
from pytest_memeval.core.history import (
    HISTORY_MODEL,
    HISTORY_TRUTH,
    describe_history,
    history_of,
    history_words,
)
from pytest_memeval.core.records import LeftTruth, Metrics, Record
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.core.stats import interval_words, rate_with_ci
from pytest_memeval.tools.compare_board import compare_many
from pytest_memeval.tools.compare_load import load_run
from pytest_memeval.tools.compare_pair import compare_runs
from pytest_memeval.tools.compare_stats import run_summary
from pytest_memeval.tools.compare_text import fmt_pp, fmt_pp_ci, fmt_rate, m2_delta_lines
from pytest_memeval.tools.compare_types import (
    CompareError,
    Comparison,
    ManyComparison,
    RunData,
    RunSummary,
)
from pytest_memeval.tools.history_compare import format_history_pair, history_pair
from pytest_memeval.tools.slice_compare import (
    SliceComparison,
    compare_slices,
    run_tags,
    slice_arguments,
)
from pytest_memeval.tools.summary_md import markdown_report
from pytest_memeval.tools.templating import render, static_text

if TYPE_CHECKING:
    from pytest_memeval.tools.gate import GateOutcome

__all__ = [
    "cli_arguments",
    "cli_main",
    "render_many",
    "render_report",
    "scenario_detail_html",
    "summary_html",
    "write_report",
]

COLORS = ("#1f6fb4", "#d9480f")  # run A, run B
LETTERS = ("A", "B")


def _csp(script: str | None) -> str:
    """The page's Content-Security-Policy: nothing from outside; our inline script by hash."""
    policy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    if script is None:
        return policy
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"{policy}; script-src 'sha256-{digest}'"


def _generated() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# -- pytest-html pieces ---------------------------------------------------------------------


def scenario_detail_html(record: Record) -> str:
    """One scenario for a pytest-html extra: prompt end, prediction vs truth, turn table."""
    wrong = sum(t.get("match") is False for t in record.get("turns", ()))
    return render("scenario_detail.html", record=record, wrong=wrong)


def summary_html(
    metrics: Metrics | None, gate: GateOutcome | None, run_dir: Path | None = None
) -> str:
    """The memeval block above pytest-html's results table: m1, m2, intervals, the gate; for
    a free-running run in ``run_dir``, where it left the truth and m2 by turn position beside
    the teacher-forced run of the checkpoint (when there is one)."""
    rows = []
    free_running = None
    if metrics is not None:
        for name, block in (("m1 final-query", metrics["m1"]), ("m2 turn-level", metrics["m2"])):
            if "ci95" not in block:  # a metrics.json from before the intervals were written
                block = rate_with_ci(block["correct"], block["total"])
            rows.append((name, fmt_rate(block), interval_words(block) or "-"))
        if history_of(metrics) == HISTORY_MODEL and run_dir is not None:
            beside = teacher_forced_beside(run_dir, metrics)
            free_running = {
                "history": describe_history(HISTORY_MODEL),
                "left": left_truth_words(metrics["left_truth"], metrics["n"])
                if "left_truth" in metrics
                else "",
                "note": beside.note,
                "table": position_table(metrics, beside),
            }
    return render("summary.html", metrics=metrics, rows=rows, gate=gate, free_running=free_running)


# -- charts: geometry as numbers; the templates (_charts.html) draw them ----------------------


def _interval_chart(
    title: str, runs: Sequence[RunSummary], key: Literal["m1", "m2"]
) -> dict[str, Any]:
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
        row: dict[str, Any] = {
            "y": top + row_h * i + row_h / 2,
            "label": run["label"],
            "color": COLORS[i % len(COLORS)],
            "block": block,
        }
        rate, ci = block["rate"], block.get("ci95")
        if rate is not None and ci is not None:  # run_summary: an interval wherever a rate
            lo, hi = ci
            row.update(lo=lo, hi=hi, x_lo=x(lo), x_hi=x(hi), x_rate=x(rate))
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


def _position_chart(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """m2 by turn position: one line per run (``label``, ``m2_by_position``: a run summary,
    or the teacher-forced run beside a free-running one), y from 0 to 100%."""
    series = []
    for run in runs:
        points = []
        for pos, slot in sorted(run["m2_by_position"].items(), key=lambda kv: int(kv[0])):
            if slot["total"]:
                points.append((int(pos), slot["correct"], slot["total"]))
        series.append(points)
    max_pos = max((p[0] for pts in series for p in pts), default=0)
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
                    {"pos": p, "correct": c, "total": t, "x": x(p), "y": y(c / t)}
                    for p, c, t in pts
                ],
            }
            for i, (run, pts) in enumerate(zip(runs, series, strict=True))
        ],
    }


def _departure_chart(series: Sequence[tuple[str, str, LeftTruth, int]]) -> dict[str, Any]:
    """Where the scenarios first left the truth: per turn position (and "never"), a bar per
    run of the share of its ``n`` scenarios. ``series``: (label, colour, left_truth, n)."""
    top = max((int(k) for _, _, left, _ in series for k in left["at"]), default=0)
    slots = [str(k) for k in range(top + 1)] + ["never"]
    width, height, left_m, right_m, top_m, bottom = 560, 220, 46, 16, 14, 36
    plot_w, plot_h = width - left_m - right_m, height - top_m - bottom
    slot_w = plot_w / len(slots)
    bar_w = max(1.0, slot_w * 0.8 / max(1, len(series)))
    peak = max(
        [
            count / n
            for _, _, left, n in series
            if n
            for count in (*left["at"].values(), left["never"])
        ]
        or [1.0]
    )
    scale = max(0.1, peak)

    def y(share: float) -> float:
        return top_m + (1 - share / scale) * plot_h

    bars = []
    for i, (label, color, left, n) in enumerate(series):
        for j, slot in enumerate(slots):
            count = left["never"] if slot == "never" else left["at"].get(slot, 0)
            if not count or not n:
                continue
            share = count / n
            bars.append(
                {
                    "x": left_m + j * slot_w + slot_w * 0.1 + i * bar_w,
                    "y": y(share),
                    "w": bar_w,
                    "h": top_m + plot_h - y(share),
                    "color": color,
                    "title": f"{label}: {count}/{n} scenarios first left the truth "
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
        "series": [{"label": label, "color": color} for label, color, _, _ in series],
    }


def _forest_plot(result: ManyComparison) -> dict[str, Any]:
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
        row: dict[str, Any] = {
            "y": top + row_h * i + row_h / 2,
            "label": r["label"],
            "color": COLORS[1] if r["m1_p_holm"] < 0.05 else COLORS[0],
            "delta": delta,
            "ci": ci,
            "p_holm": r["m1_p_holm"],
            "x_delta": x(delta),
        }
        if ci is not None:
            row.update(x_lo=x(ci[0]), x_hi=x(ci[1]))
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


# -- one run, or two (A against B) -----------------------------------------------------------


def _turns_side_by_side(recs: Sequence[Record]) -> list[dict[str, Any]]:
    """Row k: each run's turn k (``None`` past its last turn); diverge if the targets differ."""
    rows = []
    for k in range(max(len(r["turns"]) for r in recs)):
        cells: list[dict[str, Any] | None] = []
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


def _scenarios(runs: Sequence[RunData], pair: Comparison | None) -> list[dict[str, Any]]:
    """One row of the scenario table per scenario, in run A's order (``pair``: A against B,
    when there are two runs)."""
    two = pair is not None
    divergent = set(pair["divergent"]["ids"]) if pair is not None else set()
    fixed = set(pair["flips"]["fixed"]) if pair is not None else set()
    broken = set(pair["flips"]["broken"]) if pair is not None else set()
    rows = []
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
                "turns": _turns_side_by_side(recs),
            }
        )
    return rows


def _filters(two: bool) -> list[tuple[str, str]]:
    options = [("", "all scenarios"), ("a-wrong", "wrong in A"), ("a-right", "right in A")]
    if two:
        options += [
            ("b-wrong", "wrong in B"),
            ("fixed", "fixed (A wrong, B right)"),
            ("broken", "broken (A right, B wrong)"),
            ("divergent", "divergent turn structure"),
        ]
    return options


def _slices(
    runs: Sequence[RunData], labels: Sequence[str], slices: Sequence[str], method: str
) -> SliceComparison | None:
    """The per-slice comparison of ``runs[1:]`` against ``runs[0]`` when the runs have tags
    (or slices are asked for: an unknown one is refused with CompareError)."""
    if not slices and not run_tags(*runs):
        return None
    return compare_slices(runs[0], runs[1:], labels, slices=slices, method=method)


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
        _slices(runs, [pair["a"]["label"], pair["b"]["label"]], slices, method)
        if pair is not None
        else None
    )
    # One run: the same summary fields, no pairing.
    summaries = (
        [pair["a"], pair["b"]] if pair is not None else [run_summary(_one_label(runs[0]), runs[0])]
    )
    histories = _histories(runs, pair, summaries)
    return render(
        "one_or_two.html",
        title="memeval report: " + " vs ".join(s["label"] for s in summaries),
        csp=_csp(static_text("report.js")),
        generated=_generated(),
        n=pair["n"] if pair is not None else runs[0].metrics["n"],
        notes=pair["notes"] if pair is not None else [],
        letters=LETTERS[: len(runs)],
        summaries=[dict(s, color=COLORS[i], letter=LETTERS[i]) for i, s in enumerate(summaries)],
        paired=pair,
        slices=by_slice,
        run_slices_block={} if two else (runs[0].metrics.get("slices") or {}),
        m2_lines=[line.strip() for line in m2_delta_lines(pair)] if pair is not None else [],
        charts=[
            _interval_chart("m1 final-query, 95% Wilson interval", summaries, "m1"),
            _interval_chart("m2 turn-level, 95% interval clustered by scenario", summaries, "m2"),
        ],
        position=_position_chart([*summaries, *histories.pop("beside_summary", [])]),
        histories=histories,
        filters=_filters(two),
        scenarios=_scenarios(runs, pair),
    )


def _one_label(run: RunData) -> str:
    """A run alone: its checkpoint, and its history when free-running."""
    history = history_of(run.metrics)
    return run.ckpt if history == HISTORY_TRUTH else f"{run.ckpt} ({history_words(history)})"


def _histories(
    runs: Sequence[RunData], pair: Comparison | None, summaries: Sequence[RunSummary]
) -> dict[str, Any]:
    """The page's teacher-forced/free-running section: for a pair of the two histories of one
    checkpoint, the gap (:mod:`.history_compare`); for one free-running run, where it left
    the truth, and its teacher-forced run beside it (``beside_summary``: a curve for the
    position chart) when there is one. Empty for teacher-forced runs alone."""
    if pair is not None:
        found = history_pair(runs[0], runs[1], pair)
        if found is None:
            return {}
        series = [
            (s["label"], COLORS[i], left, s["n"])
            for i, s in enumerate(summaries)
            if (left := runs[i].metrics.get("left_truth")) is not None
        ]
        return {
            "lines": [line.strip() for line in format_history_pair(found, pair["n"])[1:]],
            "pair": found,
            "departures": _departure_chart(series) if series else None,
        }
    run = runs[0]
    if history_of(run.metrics) != HISTORY_MODEL:
        return {}
    metrics = run.metrics
    beside = teacher_forced_beside(run.path, metrics)
    left = metrics.get("left_truth")
    lines = [describe_history(HISTORY_MODEL)]
    if left is not None:
        lines.append(left_truth_words(left, metrics["n"]))
    lines.append(beside.note)
    series = [(summaries[0]["label"], COLORS[0], left, metrics["n"])] if left is not None else []
    out: dict[str, Any] = {"lines": lines, "pair": None}
    if beside.metrics is not None:
        tf = beside.metrics
        if "left_truth" in tf:
            series.append((f"{run.ckpt} (teacher-forced)", COLORS[1], tf["left_truth"], tf["n"]))
        out["beside_summary"] = [
            {
                "label": f"{run.ckpt} (teacher-forced)",
                "m2_by_position": dict(tf.get("m2_by_position") or {}),
            }
        ]
    out["departures"] = _departure_chart(series) if series else None
    return out


# -- many runs against one baseline ----------------------------------------------------------


def _pair_rows(pair: Comparison) -> list[tuple[str, str]]:
    """One run against the baseline: its paired numbers, as (name, text) rows."""
    mc = pair["mcnemar"]
    return [
        (
            "m1 delta",
            f"{fmt_pp(pair['m1_delta_pp'])} ({pair['m1_delta_scenarios']:+d} scenarios), 95% CI "
            f"{fmt_pp_ci(pair['m1_delta_ci95_pp'])} (paired, Newcombe)",
        ),
        (
            "paired test on m1",
            f"exact McNemar: {mc['fixed']} fixed, {mc['broken']} broken; "
            f"{mc['statement']}; Holm-adjusted p = {mc['p_holm']:.4g}",
        ),
        ("power (m1)", pair["m1_power"]["statement"]),
        ("m2", " / ".join(line.strip() for line in m2_delta_lines(pair))),
        ("divergent", f"{pair['divergent']['count']}/{pair['divergent']['total']} scenarios"),
    ]


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
        csp=_csp(None),  # no script on this page
        generated=_generated(),
        n=result["n"],
        leaderboard=result["leaderboard"],
        forest=_forest_plot(result),
        pairs=[{"pair": pair, "rows": _pair_rows(pair)} for pair in result["runs"]],
        slices=_slices([baseline, *runs], labels, slices, method),
    )


def write_report(
    paths: Sequence[Path], output: Path, *, slices: Sequence[str] = (), method: str = "holm"
) -> None:
    """Load, check and render runs into ``output`` (atomically; raises CompareError).

    One run: that run; two: A against B; more: each against the first (the baseline).
    ``slices`` and ``method``: the per-slice comparison's slices and correction.
    """
    runs = [load_run(p) for p in paths]
    page = (
        render_report(runs, slices=slices, method=method)
        if len(runs) <= 2
        else render_many(runs[0], runs[1:], slices=slices, method=method)
    )
    atomic_write(output, [page])


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``memeval report``."""
    parser.add_argument("run_a", type=Path, metavar="RUN", help="run directory (A, the baseline)")
    parser.add_argument(
        "runs",
        type=Path,
        metavar="RUN_B",
        nargs="*",
        default=[],
        help="second run directory (B), compared against A; several: each against A, on one "
        "page with a leaderboard and a forest plot",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="file to write (default: report.html; with --format markdown, standard output; "
        "'-': standard output)",
    )
    parser.add_argument(
        "--format",
        choices=("html", "markdown"),
        default="html",
        help="html (default): the self-contained page; markdown: the summary a CI job page or "
        "a pull-request comment shows (the one pytest appends to $GITHUB_STEP_SUMMARY)",
    )
    slice_arguments(parser)


def cli_main(args: argparse.Namespace) -> int:
    """Write the report: 0 on success, 2 when a run is refused."""
    paths = [args.run_a, *args.runs]
    markdown = args.format == "markdown"
    output = args.output or (Path("-") if markdown else Path("report.html"))
    try:
        if markdown:
            # The Markdown summary has no per-slice table yet (the HTML page has one).
            text = markdown_report(paths)
        elif str(output) != "-":
            write_report(paths, output, slices=args.slices, method=args.correction)
        else:
            runs = [load_run(p) for p in paths]
            text = (
                render_report(runs, slices=args.slices, method=args.correction)
                if len(runs) <= 2
                else render_many(runs[0], runs[1:], slices=args.slices, method=args.correction)
            )
    except CompareError as exc:
        print(f"memeval report: refused: {exc}", file=sys.stderr)
        return 2
    if str(output) == "-":
        sys.stdout.write(text)
        return 0
    if markdown:
        atomic_write(output, [text])
    print(f"memeval report: wrote {output}")
    return 0
