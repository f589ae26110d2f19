"""``memeval report RUN [RUN_B ...] -o report.html``: one self-contained HTML page.

With more than two runs, the page compares each with the first (the baseline): a
leaderboard, a forest plot of the m1 deltas with their paired intervals, and each run's
numbers and flipped scenarios on demand (``<details>``). With one or two, as follows.

The page holds the comparison table (m1/m2 with 95% Wilson intervals, unaligned, parse
failures, delta, divergent, the McNemar verdict), the flipped scenarios, inline SVG charts
(m1 and m2 with their intervals; m2 by turn position for each run) and a searchable table of
every scenario with its turns side by side. It loads nothing: no network, no CDN, one file
whose Content-Security-Policy allows only its own inline script (by hash) and style.

All benchmark and model text goes through :func:`html.escape`: a prediction that contains
``<script>`` is shown as those characters and never runs. The renderers for pytest-html's
summary and per-scenario extra (:mod:`pytest_memeval.tools.html_extras`) live here too.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import hashlib
import sys
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_memeval.core.ids import param_id
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.core.stats import interval_words, rate_with_ci
from pytest_memeval.tools.compare import (
    CompareError,
    RunData,
    compare_many,
    compare_runs,
    fmt_ci,
    fmt_m2_ci,
    fmt_pp,
    fmt_pp_ci,
    fmt_rate,
    load_run,
    m2_delta_lines,
    run_summary,
)

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

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2127;
background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6470;margin:0 0 12px}
table{border-collapse:collapse;background:#fff;margin:6px 0}
th,td{border:1px solid #d7dbe0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 10px;margin:6px 0}
.verdict{font-weight:600}
.ok{color:#1b7f3b}.bad{color:#b3261e}.na{color:#77808b}
.chip{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px}
.charts{display:flex;flex-wrap:wrap;gap:18px}
.chart{background:#fff;border:1px solid #d7dbe0;padding:8px}
.chart h3{font-size:14px;margin:2px 0 6px}
.flips{display:flex;gap:30px;flex-wrap:wrap}
.flips ul{margin:4px 0;padding-left:18px;columns:4;column-gap:24px}
#filters{display:flex;gap:10px;align-items:center;margin:6px 0 8px}
#q{font:inherit;padding:5px 8px;width:340px;border:1px solid #b8c0c8;border-radius:4px}
#scenarios{width:100%}
pre,.txt{margin:0;white-space:pre-wrap;word-break:break-word;
font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
#scenarios details summary{cursor:pointer;color:#1f6fb4}
table.turns{font-size:12.5px}table.turns td{padding:2px 6px}
tr.diverge td.t{background:#fff3cd}
"""

_SCRIPT = """
(function(){
  var q=document.getElementById('q'), f=document.getElementById('only'),
      rows=[].slice.call(document.querySelectorAll('#scenarios tbody tr.scn')),
      shown=document.getElementById('shown');
  function apply(){
    var text=q.value.toLowerCase(), only=f.value, n=0;
    rows.forEach(function(r){
      var hit=(!text || r.textContent.toLowerCase().indexOf(text)>=0) &&
              (!only || r.classList.contains(only));
      r.hidden=!hit; if(hit){n++;}
    });
    shown.textContent=n+' of '+rows.length+' scenarios shown';
  }
  // A link may carry a search: report.html#q=s0003 (and #only=fixed).
  var h=new URLSearchParams(location.hash.slice(1));
  if(h.get('q')){q.value=h.get('q');}
  if(h.get('only')){f.value=h.get('only');}
  q.addEventListener('input',apply); f.addEventListener('change',apply); apply();
})();
"""


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{digest}'"
    )


def _mark(match: bool | None) -> str:
    # Inline colours too: pytest-html's page does not carry this module's stylesheet.
    if match is None:
        return '<span class="na" style="color:#77808b" title="not scored">–</span>'
    if match:
        return '<span class="ok" style="color:#1b7f3b">✓</span>'
    return '<span class="bad" style="color:#b3261e">✗</span>'


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


# -- pytest-html pieces ---------------------------------------------------------------------


def scenario_detail_html(record: Mapping[str, Any]) -> str:
    """One scenario for a pytest-html extra: prompt end, prediction vs truth, turn table."""
    final = (
        f"<p><b>final query</b> {_mark(record.get('final_match'))} predicted "
        f"<code>{escape(str(record.get('final_pred')))}</code>, truth "
        f"<code>{escape(str(record.get('final_gt')))}</code>"
        + (
            f" — <b class='bad'>parse failure</b> ({escape(str(record.get('parse_fail_reason')))})"
            if record.get("parse_fail")
            else ""
        )
        + "</p>"
    )
    tail = (
        f"<p><b>final prompt ends</b></p><pre>…{escape(str(record.get('prompt_tail', '')))}</pre>"
    )
    aligned = (
        "aligned with memory_chain"
        if record.get("aligned")
        else f"unaligned ({record.get('n_turns')} turns vs {record.get('n_memory_chain')} "
        "memory_chain entries): turns recorded, not scored for m2"
    )
    rows = "".join(
        f"<tr><td class='num'>{t['index']}</td><td>{escape(str(t.get('target')))}</td>"
        f"<td>{escape(str(t['gt'])) if t.get('gt') is not None else '–'}</td>"
        f"<td>{escape(str(t.get('pred')))}</td><td>{_mark(t.get('match'))}"
        f"{' parse failure' if t.get('parse_fail') else ''}</td></tr>"
        for t in record.get("turns", ())
    )
    turn_list = record.get("turns", ())
    wrong = sum(t.get("match") is False for t in turn_list)
    # Collapsed unless a turn is wrong: a passing scenario's 30 turns would bury the rest.
    turns = (
        f"<details{' open' if wrong else ''}><summary><b>turns</b>: {len(turn_list)}, "
        f"{wrong} wrong; {escape(aligned)}</summary><table class='turns'><thead><tr><th>#</th>"
        "<th>target</th><th>truth</th><th>prediction</th><th>match</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></details>"
    )
    return (
        f"<div class='memeval-scenario'><p><b>scenario {escape(str(record.get('id')))}</b></p>"
        f"{final}{tail}{turns}</div>"
    )


def summary_html(metrics: Mapping[str, Any] | None, gate: GateOutcome | None) -> str:
    """The memeval block above pytest-html's results table: m1, m2, intervals, the gate."""
    if metrics is None:
        return "<div class='memeval-summary'><h2>memeval</h2><p>no run was written</p></div>"
    cell = "style='padding:2px 12px 2px 0;text-align:left'"
    lines = [f"<h2>memeval: {escape(str(metrics.get('ckpt')))}</h2><table>"]
    lines.append(f"<tr><th {cell}></th><th {cell}>count</th><th {cell}>95% interval</th></tr>")
    for key, name in (("m1", "m1 final-query"), ("m2", "m2 turn-level")):
        block = dict(metrics[key])
        if "ci95" not in block:  # a metrics.json from before the intervals were written
            block = rate_with_ci(block["correct"], block["total"])
        lines.append(
            f"<tr><td {cell}>{name}</td><td class='num' {cell}>{escape(fmt_rate(block))}</td>"
            f"<td {cell}>{escape(interval_words(block) or '-')}</td></tr>"
        )
    lines.append("</table>")
    pf = metrics["parse_fail"]
    lines.append(
        f"<p>{metrics['n']} scenarios ({'complete' if metrics.get('complete') else 'INCOMPLETE'}); "
        f"unaligned {metrics['unaligned']}; parse failures: final {pf['final']}, "
        f"turns {pf['turns']}</p>"
    )
    if gate is not None and gate.checks:
        verdict = "PASSED" if gate.passed else "FAILED"
        color = "#1b7f3b" if gate.passed else "#b3261e"
        lines.append(f"<p style='font-weight:600;color:{color}'>gate {verdict}</p><ul>")
        lines += [
            f"<li style='color:#8a6100'>WARN: {escape(warning)}</li>" for warning in gate.warnings
        ]
        lines += [
            f"<li style='color:{'#1b7f3b' if c.passed else '#b3261e'}'>"
            f"{'PASS' if c.passed else 'FAIL'}: {escape(c.detail)}</li>"
            for c in gate.checks
        ]
        lines.append("</ul>")
    return "<div class='memeval-summary'>" + "".join(lines) + "</div>"


# -- charts ---------------------------------------------------------------------------------


def _interval_chart(title: str, runs: Sequence[Mapping[str, Any]], key: str) -> str:
    """Dot (rate) and whisker (95% interval) per run, on a labelled percent axis."""
    width, left, right, row_h, top = 560, 120, 150, 34, 26
    lows = [r[key]["ci95"][0] for r in runs if r[key]["ci95"] is not None]
    lo_axis = 0.0
    if lows and min(lows) > 0.5:
        # Zoom to where the data is, in 10-point steps; the ticks say where the axis starts.
        lo_axis = max(0.0, int((min(lows) - 0.02) * 10) / 10)
    span = 1.0 - lo_axis
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + (v - lo_axis) / span * plot_w

    height = top + row_h * len(runs) + 28
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(title)}" class="ci-chart" data-metric="{key}">'
    ]
    ticks = [lo_axis + span * i / 5 for i in range(6)]
    axis_y = top + row_h * len(runs)
    for t in ticks:
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{top - 8}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#e3e6ea"/>'
            f'<text x="{x(t):.1f}" y="{axis_y + 16}" font-size="11" text-anchor="middle" '
            f'fill="#5b6470">{t * 100:.0f}%</text>'
        )
    for i, run in enumerate(runs):
        y = top + row_h * i + row_h / 2
        block = run[key]
        color = COLORS[i % len(COLORS)]
        parts.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end">'
            f"{escape(_short(run['label']))}</text>"
        )
        if block["rate"] is None:
            parts.append(
                f'<text x="{left}" y="{y + 4:.1f}" font-size="12" fill="#77808b">'
                "nothing scored</text>"
            )
            continue
        lo, hi = block["ci95"]
        parts.append(
            f"<g><title>{escape(run['label'])}: {escape(fmt_rate(block))}, 95% CI "
            f"{escape(fmt_ci(block))}</title>"
            f'<line x1="{x(lo):.1f}" y1="{y:.1f}" x2="{x(hi):.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="2"/>'
            f'<line x1="{x(lo):.1f}" y1="{y - 6:.1f}" x2="{x(lo):.1f}" y2="{y + 6:.1f}" '
            f'stroke="{color}" stroke-width="2"/>'
            f'<line x1="{x(hi):.1f}" y1="{y - 6:.1f}" x2="{x(hi):.1f}" y2="{y + 6:.1f}" '
            f'stroke="{color}" stroke-width="2"/>'
            f'<circle cx="{x(block["rate"]):.1f}" cy="{y:.1f}" r="5" fill="{color}"/></g>'
            f'<text x="{width - right + 10}" y="{y + 4:.1f}" font-size="12">'
            f"{_pct(block['rate'])} [{lo * 100:.1f}, {hi * 100:.1f}]</text>"
        )
    parts.append("</svg>")
    return f'<div class="chart"><h3>{escape(title)}</h3>{"".join(parts)}</div>'


def _position_chart(runs: Sequence[Mapping[str, Any]]) -> str:
    """m2 by turn position: one line per run, y from 0 to 100%."""
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

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'aria-label="m2 by turn position" class="position-chart">'
    ]
    for frac in (0, 0.25, 0.5, 0.75, 1):
        parts.append(
            f'<line x1="{left}" y1="{y(frac):.1f}" x2="{width - right}" y2="{y(frac):.1f}" '
            f'stroke="#e3e6ea"/><text x="{left - 6}" y="{y(frac) + 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="#5b6470">{frac * 100:.0f}%</text>'
        )
    step = max(1, (max_pos + 1) // 10)
    for pos in range(0, max_pos + 1, step):
        parts.append(
            f'<text x="{x(pos):.1f}" y="{height - bottom + 16}" font-size="11" '
            f'text-anchor="middle" fill="#5b6470">{pos}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" font-size="11" text-anchor="middle" '
        'fill="#5b6470">turn position (aligned scenarios)</text>'
    )
    for i, (run, pts) in enumerate(zip(runs, series, strict=True)):
        color = COLORS[i % len(COLORS)]
        if not pts:
            continue
        path = " ".join(f"{x(p):.1f},{y(c / t):.1f}" for p, c, t in pts)
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" '
            f'data-run="{escape(run["label"])}"/>'
        )
        for p, c, t in pts:
            parts.append(
                f'<circle cx="{x(p):.1f}" cy="{y(c / t):.1f}" r="3" fill="{color}">'
                f"<title>{escape(run['label'])}, turn {p}: {c}/{t} = {c / t * 100:.2f}%</title>"
                "</circle>"
            )
    parts.append("</svg>")
    legend = " ".join(
        f'<span><span class="chip" style="background:{COLORS[i % len(COLORS)]}"></span>'
        f"{escape(_short(run['label']))}" + ("" if series[i] else " (no aligned turns)") + "</span>"
        for i, run in enumerate(runs)
    )
    return (
        f'<div class="chart"><h3>m2 by turn position</h3>{"".join(parts)}<div>{legend}</div></div>'
    )


def _short(label: str, limit: int = 18) -> str:
    return label if len(label) <= limit else "…" + label[-(limit - 1) :]


# -- the page -------------------------------------------------------------------------------


def _single(run: RunData) -> dict[str, Any]:
    """A one-run 'comparison' (the same summary fields, no pairing)."""
    return {"a": run_summary(run.ckpt, run), "n": run.metrics["n"], "notes": []}


def _summary_table(result: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "<tr><th>run</th><th>m1 final-query</th><th>m1 95% CI</th><th>m2 turn-level</th>"
        "<th>m2 95% CI (by scenario)</th><th>unaligned</th>"
        "<th>parse failures (final / turns)</th></tr>"
    )
    body = ""
    for i, run in enumerate(runs):
        body += (
            f"<tr class='run'><td><span class='chip' style='background:{COLORS[i]}'></span>"
            f"<b>{'AB'[i]}</b> {escape(run['label'])}<br><small class='na'>"
            f"{escape(run['path'])}</small></td>"
            f"<td class='num m1'>{escape(fmt_rate(run['m1']))}</td>"
            f"<td class='num'>{escape(fmt_ci(run['m1']))}</td>"
            f"<td class='num m2'>{escape(fmt_rate(run['m2']))}</td>"
            f"<td class='num'>{escape(fmt_m2_ci(run['m2']))}</td>"
            f"<td class='num'>{run['unaligned']}/{run['n']}</td>"
            f"<td class='num'>{run['parse_fail']['final']} / {run['parse_fail']['turns']}</td></tr>"
        )
    out = f"<table id='compare'><thead>{head}</thead><tbody>{body}</tbody></table>"
    if "mcnemar" not in result:
        return out
    mc, div = result["mcnemar"], result["divergent"]
    d = result["m1_delta_scenarios"]
    cls = "ok" if mc["significant"] else "na"
    out += (
        "<table id='paired'><tbody>"
        f"<tr><th>m1 delta (B − A)</th><td class='num' id='delta'>{fmt_pp(result['m1_delta_pp'])} "
        f"({d:+d} scenarios), 95% CI {escape(fmt_pp_ci(result['m1_delta_ci95_pp']))} "
        "(paired, Newcombe)</td></tr>"
        f"<tr><th>m2 delta (B − A)</th><td id='m2-delta'>"
        + "<br>".join(escape(line.strip()) for line in m2_delta_lines(result))
        + "</td></tr>"
        f"<tr><th>power (m1)</th><td id='power'>{escape(result['m1_power']['statement'])}"
        "</td></tr>"
        f"<tr><th>divergent</th><td class='num' id='divergent'>{div['count']}/{div['total']} "
        "</td></tr>"
        f"<tr><th>paired test on m1</th><td>exact McNemar: {mc['fixed']} fixed, {mc['broken']} "
        f"broken; <span class='verdict {cls}' id='mcnemar'>{escape(mc['statement'])}</span>"
        "</td></tr>"
        "</tbody></table>"
        "<p class='sub'>divergent: scenarios whose turn structure (the number or content of the "
        "turns) differs between the two runs. The McNemar test uses only the scenarios whose m1 "
        "outcome changed; few changed scenarios cannot show a difference, however the percentages "
        "look.</p>"
    )
    return out


def _flips(result: Mapping[str, Any]) -> str:
    def items(ids: Sequence[str]) -> str:
        if not ids:
            return "<p class='na'>none</p>"
        return (
            "<ul>"
            + "".join(f"<li><a href='#s-{param_id(i)}'>{escape(i)}</a></li>" for i in ids)
            + "</ul>"
        )

    flips = result["flips"]
    return (
        "<div class='flips'>"
        f"<div id='fixed'><h3 class='ok'>fixed: {len(flips['fixed'])} (wrong in A, right in B)</h3>"
        f"{items(flips['fixed'])}</div>"
        f"<div id='broken'><h3 class='bad'>broken: {len(flips['broken'])} (right in A, wrong in B)"
        f"</h3>{items(flips['broken'])}</div></div>"
    )


def _final_cell(rec: Mapping[str, Any]) -> str:
    pf = " <b class='bad'>parse failure</b>" if rec.get("parse_fail") else ""
    return (
        f"<td class='final'>{_mark(rec.get('final_match'))} <span class='txt'>"
        f"{escape(str(rec.get('final_pred')))}</span>{pf}</td>"
    )


def _turns_side_by_side(recs: Sequence[Mapping[str, Any]]) -> str:
    n = max(len(r["turns"]) for r in recs)
    head = (
        "<tr><th>#</th>"
        + "".join(
            f"<th>{'AB'[i]} target</th><th>{'AB'[i]} prediction</th><th></th>"
            for i in range(len(recs))
        )
        + "</tr>"
    )
    rows = []
    for k in range(n):
        cells = []
        targets = []
        for rec in recs:
            if k < len(rec["turns"]):
                t = rec["turns"][k]
                targets.append(t.get("target"))
                cells.append(
                    f"<td class='t'>{escape(str(t.get('target')))}</td>"
                    f"<td>{escape(str(t.get('pred')))}</td><td>{_mark(t.get('match'))}</td>"
                )
            else:
                targets.append(None)
                cells.append("<td class='t na'>—</td><td></td><td></td>")
        diverge = len(recs) > 1 and len(set(map(str, targets))) > 1
        cls = " class=diverge" if diverge else ""
        rows.append(f"<tr{cls}><td class='num'>{k}</td>{''.join(cells)}</tr>")
    return f"<table class='turns'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _scenario_table(runs: Sequence[RunData], result: Mapping[str, Any]) -> str:
    two = len(runs) == 2
    divergent = set(result["divergent"]["ids"]) if two else set()
    fixed = set(result["flips"]["fixed"]) if two else set()
    broken = set(result["flips"]["broken"]) if two else set()
    head = (
        "<tr><th>scenario</th><th>truth</th>"
        + "".join(f"<th>{'AB'[i]} final prediction</th>" for i in range(len(runs)))
        + "<th>turns</th></tr>"
    )
    rows = []
    for sid, rec_a in runs[0].records.items():
        recs = [rec_a] + ([runs[1].records[sid]] if two else [])
        classes = ["scn"]
        for i, rec in enumerate(recs):
            classes.append(f"{'ab'[i]}-{'right' if rec['final_match'] is True else 'wrong'}")
        if sid in divergent:
            classes.append("divergent")
        if sid in fixed:
            classes.append("fixed")
        if sid in broken:
            classes.append("broken")
        structure = "divergent" if sid in divergent else ("same structure" if two else "")
        summary = f"{len(rec_a['turns'])} turns" + (
            f" / {len(recs[1]['turns'])} turns" if two else ""
        )
        finals = "".join(_final_cell(rec) for rec in recs)
        rows.append(
            # The anchor is the pytest id: an HTML id and a URL fragment must hold no spaces
            # (and "#", "%" would need escaping); the pytest id is ASCII [A-Za-z0-9_.+-].
            f"<tr class='{' '.join(classes)}' id='s-{param_id(sid)}'>"
            f"<td><b>{escape(sid)}</b><br><small class='na'>{escape(structure)}</small></td>"
            f"<td class='truth'><span class='txt'>{escape(str(rec_a.get('final_gt')))}</span></td>"
            f"{finals}"
            f"<td><details><summary>{escape(summary)}</summary>"
            f"<p class='sub'>prompt ends: <code>…{escape(str(rec_a.get('prompt_tail', '')))}"
            "</code></p>"
            f"{_turns_side_by_side(recs)}</details></td></tr>"
        )
    options = [("", "all scenarios"), ("a-wrong", "wrong in A"), ("a-right", "right in A")]
    if two:
        options += [
            ("b-wrong", "wrong in B"),
            ("fixed", "fixed (A wrong, B right)"),
            ("broken", "broken (A right, B wrong)"),
            ("divergent", "divergent turn structure"),
        ]
    select = "".join(f"<option value='{v}'>{escape(t)}</option>" for v, t in options)
    return (
        "<div id='filters'><input id='q' type='search' placeholder='search ids, predictions, "
        "truths, turns…' aria-label='search scenarios'>"
        f"<select id='only' aria-label='filter'>{select}</select><span id='shown' class='na'>"
        "</span></div>"
        f"<table id='scenarios'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_report(runs: Sequence[RunData]) -> str:
    """The page for one run or two (A, B); raises CompareError if two are not comparable."""
    if len(runs) not in (1, 2):
        raise ValueError("render_report takes one or two runs")
    result = compare_runs(runs[0], runs[1]) if len(runs) == 2 else _single(runs[0])
    summaries = [result["a"]] + ([result["b"]] if len(runs) == 2 else [])
    title = "memeval report: " + " vs ".join(s["label"] for s in summaries)
    notes = "".join(f"<div class='note'>{escape(n)}</div>" for n in result["notes"])
    charts = (
        "<div class='charts'>"
        + _interval_chart("m1 final-query, 95% Wilson interval", summaries, "m1")
        + _interval_chart("m2 turn-level, 95% interval clustered by scenario", summaries, "m2")
        + _position_chart(summaries)
        + "</div>"
    )
    flips = f"<h2>Flipped scenarios</h2>{_flips(result)}" if len(runs) == 2 else ""
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{_csp(_SCRIPT)}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1><p class='sub'>{result['n']} scenarios · generated {generated}"
        " by memeval report</p>"
        f"{notes}<h2>Summary</h2>{_summary_table(result, summaries)}"
        f"<h2>Charts</h2>{charts}{flips}"
        f"<h2>Scenarios</h2>{_scenario_table(runs, result)}"
        f"</main><script>{_SCRIPT}</script></body></html>\n"
    )


# -- many runs against one baseline ----------------------------------------------------------


def _forest_plot(result: Mapping[str, Any]) -> str:
    """m1 delta (run - baseline) per run with its paired 95% interval, on a pp axis through 0."""
    rows = [r for r in result["leaderboard"] if not r["baseline"]]
    bounds = [0.0]
    for r in rows:
        bounds.append(r["m1_delta_pp"])
        if r["m1_delta_ci95_pp"] is not None:
            bounds += list(r["m1_delta_ci95_pp"])
    reach = max(1.0, max(abs(b) for b in bounds))
    step = next(t for t in (0.5, 1, 2, 5, 10, 20, 25, 50) if reach / t <= 5)
    reach = step * -(-reach // step)
    width, left, right, row_h, top = 720, 200, 230, 30, 26
    plot_w = width - left - right

    def x(v: float) -> float:
        return left + (v + reach) / (2 * reach) * plot_w

    axis_y = top + row_h * len(rows)
    height = axis_y + 34
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'role="img" aria-label="m1 delta against the baseline, 95% paired intervals" '
        'class="forest-plot">'
    ]
    ticks = int(2 * reach / step)
    for i in range(ticks + 1):
        t = -reach + i * step
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{top - 8}" x2="{x(t):.1f}" y2="{axis_y}" '
            f'stroke="{"#77808b" if t == 0 else "#e3e6ea"}"/>'
            f'<text x="{x(t):.1f}" y="{axis_y + 16}" font-size="11" text-anchor="middle" '
            f'fill="#5b6470">{f"{t:+g}" if t else "0"}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 2}" font-size="11" '
        'text-anchor="middle" fill="#5b6470">m1 delta vs baseline, percentage points</text>'
    )
    for i, r in enumerate(rows):
        y = top + row_h * i + row_h / 2
        color = COLORS[1] if r["m1_p_holm"] < 0.05 else COLORS[0]
        ci = r["m1_delta_ci95_pp"]
        label = escape(r["label"])
        parts.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end">'
            f"{escape(_short(r['label'], 28))}</text>"
        )
        whisker = ""
        if ci is not None:
            lo, hi = ci
            whisker = (
                f'<line x1="{x(lo):.1f}" y1="{y:.1f}" x2="{x(hi):.1f}" y2="{y:.1f}" '
                f'stroke="{color}" stroke-width="2"/>'
                f'<line x1="{x(lo):.1f}" y1="{y - 6:.1f}" x2="{x(lo):.1f}" y2="{y + 6:.1f}" '
                f'stroke="{color}" stroke-width="2"/>'
                f'<line x1="{x(hi):.1f}" y1="{y - 6:.1f}" x2="{x(hi):.1f}" y2="{y + 6:.1f}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
        parts.append(
            f'<g class="forest-row" data-run="{label}"><title>{label}: '
            f"{escape(fmt_pp(r['m1_delta_pp']))}, 95% CI {escape(fmt_pp_ci(ci))}, "
            f"Holm-adjusted p = {r['m1_p_holm']:.4g}</title>{whisker}"
            f'<circle cx="{x(r["m1_delta_pp"]):.1f}" cy="{y:.1f}" r="5" fill="{color}"/></g>'
            f'<text x="{width - right + 10}" y="{y + 4:.1f}" font-size="12">'
            f"{escape(fmt_pp(r['m1_delta_pp']))} {escape(fmt_pp_ci(ci))}</text>"
        )
    parts.append("</svg>")
    return (
        '<div class="chart"><h3>m1 delta against the baseline, 95% paired interval '
        "(Newcombe)</h3>" + "".join(parts) + "</div>"
    )


def _leaderboard(result: Mapping[str, Any]) -> str:
    head = (
        "<tr><th>#</th><th>run</th><th>m1 final-query</th><th>m1 95% CI</th>"
        "<th>m1 delta vs baseline</th><th>delta 95% CI</th><th>McNemar p (Holm)</th>"
        "<th>m1 MDE</th><th>m2 turn-level</th><th>m2 95% CI (by scenario)</th>"
        "<th>m2 paired delta</th><th>m2 p (Holm)</th></tr>"
    )
    body = ""
    for r in result["leaderboard"]:
        base = r["baseline"]
        cells = [
            str(r["rank"]),
            f"<b>{escape(r['label'])}</b>{' (baseline)' if base else ''}<br>"
            f"<small class='na'>{escape(r['path'])}</small>",
            escape(fmt_rate(r["m1"])),
            escape(fmt_ci(r["m1"])),
        ]
        if base:
            cells += [""] * 4
        else:
            cells += [
                escape(fmt_pp(r["m1_delta_pp"])),
                escape(fmt_pp_ci(r["m1_delta_ci95_pp"])),
                f"{r['m1_p']:.4g} ({r['m1_p_holm']:.4g})",
                "n/a" if r["m1_mde_pp"] is None else f"{r['m1_mde_pp']:.1f} pp",
            ]
        cells += [escape(fmt_rate(r["m2"])), escape(fmt_m2_ci(r["m2"]))]
        if base or r["m2_paired_delta_pp"] is None:
            cells += ["" if base else "not comparable", ""]
        else:
            cells += [
                f"{escape(fmt_pp(r['m2_paired_delta_pp']))} over "
                f"{r['m2_paired_scenarios']} scenarios",
                f"{r['m2_p_holm']:.4g}",
            ]
        cls = "run baseline" if base else "run"
        body += (
            f"<tr class='{cls}'>"
            + "".join(
                f"<td class='num'>{c}</td>" if i not in (1,) else f"<td>{c}</td>"
                for i, c in enumerate(cells)
            )
            + "</tr>"
        )
    return f"<table id='leaderboard'><thead>{head}</thead><tbody>{body}</tbody></table>"


def _pair_details(pair: Mapping[str, Any]) -> str:
    """One run against the baseline, collapsed: its paired numbers and its flips."""
    mc, flips = pair["mcnemar"], pair["flips"]
    d = pair["m1_delta_scenarios"]
    rows = [
        (
            "m1 delta",
            f"{fmt_pp(pair['m1_delta_pp'])} ({d:+d} scenarios), 95% CI "
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
    table = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    notes = "".join(f"<div class='note'>{escape(n)}</div>" for n in pair["notes"])

    def ids(values: Sequence[str]) -> str:
        if not values:
            return "<p class='na'>none</p>"
        return "<ul>" + "".join(f"<li>{escape(v)}</li>" for v in values) + "</ul>"

    return (
        f"<details class='pair'><summary><b>{escape(pair['b']['label'])}</b>: m1 "
        f"{escape(fmt_pp(pair['m1_delta_pp']))}, {len(flips['fixed'])} fixed, "
        f"{len(flips['broken'])} broken</summary>{notes}<table><tbody>{table}</tbody></table>"
        "<div class='flips'>"
        f"<div class='fixed'><h3 class='ok'>fixed: {len(flips['fixed'])} (wrong in the "
        f"baseline, right here)</h3>{ids(flips['fixed'])}</div>"
        f"<div class='broken'><h3 class='bad'>broken: {len(flips['broken'])} (right in the "
        f"baseline, wrong here)</h3>{ids(flips['broken'])}</div></div></details>"
    )


def render_many(baseline: RunData, runs: Sequence[RunData]) -> str:
    """One page for several runs against a baseline: the leaderboard, a forest plot of the
    m1 deltas with their paired intervals, and each run's numbers and flips on demand."""
    result = compare_many(baseline, runs)
    base = result["baseline"]
    title = f"memeval report: {len(runs)} runs against {base['label']}"
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    pairs = "".join(_pair_details(pair) for pair in result["runs"])
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1><p class='sub'>{result['n']} scenarios · each run compared "
        "with the baseline, paired; p-values Holm-corrected over the runs · generated "
        f"{generated} by memeval report</p>"
        f"<h2>Leaderboard (by m1)</h2>{_leaderboard(result)}"
        "<p class='sub'>m1 MDE: the smallest m1 difference each comparison could detect (80% "
        "power, alpha 0.05), from its number of changed scenarios. m2 paired delta: over the "
        "scenarios both runs score on the same turns only.</p>"
        f"<h2>m1 against the baseline</h2><div class='charts'>{_forest_plot(result)}</div>"
        f"<h2>Each run</h2>{pairs}"
        "</main></body></html>\n"
    )


def write_report(paths: Sequence[Path], output: Path) -> None:
    """Load, check and render runs into ``output`` (atomically; raises CompareError).

    One run: that run; two: A against B; more: each against the first (the baseline).
    """
    runs = [load_run(p) for p in paths]
    page = render_report(runs) if len(runs) <= 2 else render_many(runs[0], runs[1:])
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
        default=Path("report.html"),
        help="HTML file to write (default: report.html)",
    )


def cli_main(args: argparse.Namespace) -> int:
    """Write the report: 0 on success, 2 when a run is refused."""
    paths = [args.run_a, *args.runs]
    try:
        write_report(paths, args.output)
    except CompareError as exc:
        print(f"memeval report: refused: {exc}", file=sys.stderr)
        return 2
    print(f"memeval report: wrote {args.output}")
    return 0
