"""The comparison as text: what ``memeval compare`` prints without ``--json``.

:func:`format_comparison` renders a pair (:class:`~.compare_types.Comparison`),
:func:`format_many` a leaderboard and its pairs (:class:`~.compare_types.ManyComparison`).
The ``fmt_*`` helpers turn a rate block or a difference into the words and numbers the
tables show; the HTML report and the Markdown summary use them too, so every view of a
comparison says the same thing the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_memeval.core.formatting import columns, percent, score_text, shown_ids
from pytest_memeval.core.records import RateBlock
from pytest_memeval.core.stats import METHOD_WORDS
from pytest_memeval.tools.compare.types import (
    Comparison,
    Flips,
    ManyComparison,
    McNemar,
    RunSummary,
)

__all__ = [
    "fmt_ci",
    "fmt_m2_ci",
    "fmt_pp",
    "fmt_pp_ci",
    "fmt_rate",
    "format_comparison",
    "format_many",
    "m2_delta_lines",
]


def fmt_rate(block: RateBlock) -> str:
    """``167/189 = 88.36%`` (or ``0/0 = n/a``)."""
    return score_text(block["correct"], block["total"], block["rate"])


def fmt_ci(block: RateBlock) -> str:
    """``[83.01%, 92.19%]`` (the 95% Wilson interval) or ``-``."""
    if block["ci95"] is None:
        return "-"
    low, high = block["ci95"]
    return f"[{percent(low)}, {percent(high)}]"


def fmt_pp(value: float | None) -> str:
    """``+1.06 pp`` or ``n/a``."""
    return "n/a" if value is None else f"{value:+.2f} pp"


def fmt_pp_ci(ci: Sequence[float] | None) -> str:
    """``[-2.01, +4.12] pp`` or ``-``."""
    return "-" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}] pp"


def fmt_m2_ci(block: RateBlock) -> str:
    """m2's interval with the number of scenarios (clusters) its turns come from."""
    if block["ci95"] is None:
        return "-"
    method = str(block.get("ci95_method"))
    how = METHOD_WORDS.get(method, method).replace(" by scenario", "")
    return f"{fmt_ci(block)} ({how}, {block.get('clusters')} scenarios)"


def m2_delta_lines(result: Comparison) -> list[str]:
    """The m2 lines of a pair: the unpaired overall delta and the paired one, each with
    what it was computed over (never a bare m2 delta)."""
    lines = [f"m2 delta (B - A), {result['m2_delta_over']}: {fmt_pp(result['m2_delta_pp'])}"]
    m2 = result["m2_paired"]
    rate_a, rate_b = m2["a"], m2["b"]  # given exactly when delta_pp is (paired_m2)
    if m2["delta_pp"] is None or rate_a is None or rate_b is None:
        lines.append(f"m2 paired (B - A): {m2['statement']} (0 of {m2['of']} scenarios)")
    else:
        line = (
            f"m2 paired (B - A) over the {m2['scenarios']} of {m2['of']} scenarios scored on "
            f"the same turns in both runs ({m2['turns']} turns): A {percent(rate_a)}, "
            f"B {percent(rate_b)}, delta {fmt_pp(m2['delta_pp'])}"
        )
        if m2["ci95_pp"] is not None:
            line += f", 95% CI {fmt_pp_ci(m2['ci95_pp'])} (clustered by scenario)"
        elif m2["changed"] == 0:
            line += ", 95% CI n/a (no compared scenario changed its m2 score)"
        else:
            line += ", 95% CI n/a (one scenario, or every scenario differs alike)"
        line += f"; exact sign-flip permutation test: {m2['statement']}"
        if "p_holm" in m2:
            line += f" (Holm-adjusted p = {m2['p_holm']:.4g})"
        lines.append(line)
    if m2["not_comparable"]:
        lines.append(
            f"  m2 not comparable on {m2['not_comparable']} scenario(s): different turn "
            "structure, or unaligned in a run"
        )
    return lines


def format_comparison(result: Comparison) -> str:
    """The human-readable comparison (what ``memeval compare`` prints without ``--json``)."""
    a, b = result["a"], result["b"]
    lines = [f"A = {a['label']} ({a['path']})", f"B = {b['label']} ({b['path']})"]
    lines += [f"note: {note}" for note in result["notes"]]
    lines.append("")
    lines += _run_table(a, b)
    lines.append("")
    d = result["m1_delta_scenarios"]
    plural = "s" if abs(d) != 1 else ""
    lines.append(
        f"m1 delta (B - A): {fmt_pp(result['m1_delta_pp'])} ({d:+d} scenario{plural}), "
        f"95% CI {fmt_pp_ci(result['m1_delta_ci95_pp'])} (paired, Newcombe)"
    )
    lines += m2_delta_lines(result)
    div = result["divergent"]
    lines.append(
        f"divergent: {div['count']}/{div['total']} scenarios have a different turn structure "
        "(number or content of turns) in the two runs"
    )
    lines += _mcnemar_lines(result["mcnemar"], result["n"])
    lines.append(f"power: {result['m1_power']['statement']}")
    lines += _flip_lines(result["flips"])
    return "\n".join(lines)


def _run_table(a: RunSummary, b: RunSummary) -> list[str]:
    """The two runs' rates, intervals, unaligned scenarios and parse failures, as columns."""
    header = [
        "run",
        "m1 final-query",
        "m1 95% CI",
        "m2 turn-level",
        "m2 95% CI (by scenario)",
        "unaligned",
        "parse_fail (final/turns)",
    ]
    rows = [header]
    for run in (a, b):
        rows.append(
            [
                run["label"],
                fmt_rate(run["m1"]),
                fmt_ci(run["m1"]),
                fmt_rate(run["m2"]),
                fmt_m2_ci(run["m2"]),
                f"{run['unaligned']}/{run['n']}",
                f"{run['parse_fail']['final']}/{run['parse_fail']['turns']}",
            ]
        )
    return columns(rows)


def _mcnemar_lines(mc: McNemar, n: int) -> list[str]:
    """The McNemar test of a pair over ``n`` scenarios, Holm-adjusted where it was, and its
    verdict in words."""
    if mc["discordant"] == 0:
        verdict = "no scenario changed its m1 outcome, so there is no evidence of a difference"
    elif mc["significant"]:
        verdict = (
            f"the m1 difference is unlikely to be chance alone (significant at {mc['alpha']:g})"
        )
    else:
        verdict = (
            f"the m1 difference is compatible with chance (not significant at {mc['alpha']:g}); "
            f"{mc['discordant']} changed scenario(s) out of {n} are not a strong signal"
        )
    lines = [
        f"paired test on m1 (exact McNemar): {mc['fixed']} fixed, {mc['broken']} broken, "
        f"{mc['statement']}"
    ]
    if "p_holm" in mc:
        lines.append(
            f"  Holm-adjusted over the compared runs: p = {mc['p_holm']:.4g}: "
            + ("significant" if mc["significant_holm"] else "not significant")
            + f" at {mc['alpha']:g}"
        )
    lines.append(f"  in words: {verdict}")
    return lines


def _flip_lines(flips: Flips) -> list[str]:
    """The fixed and the broken scenarios, counted and named."""
    return [
        f"fixed  (wrong in A, right in B): {len(flips['fixed'])}"
        + (f": {shown_ids(flips['fixed'])}" if flips["fixed"] else ""),
        f"broken (right in A, wrong in B): {len(flips['broken'])}"
        + (f": {shown_ids(flips['broken'])}" if flips["broken"] else ""),
    ]


def format_many(result: ManyComparison) -> str:
    """The text of ``memeval compare BASELINE RUN RUN ...``: leaderboard, then each pair."""
    base = result["baseline"]
    k = len(result["runs"])
    lines = [
        f"baseline = {base['label']} ({base['path']}), {k} run(s) compared with it over "
        f"{result['n']} scenarios; paired p-values Holm-corrected over the {k} runs",
        "",
        "leaderboard (by m1):",
    ]
    rows = [
        [
            "#",
            "run",
            "m1 final-query",
            "m1 95% CI",
            "m1 delta vs baseline",
            "delta 95% CI",
            "McNemar p (Holm)",
            "m1 MDE",
            "m2 turn-level",
            "m2 95% CI (by scenario)",
        ]
    ]
    for row in result["leaderboard"]:
        base_row = row["baseline"]
        rows.append(
            [
                str(row["rank"]),
                row["label"] + (" (baseline)" if base_row else ""),
                fmt_rate(row["m1"]),
                fmt_ci(row["m1"]),
                "" if base_row else fmt_pp(row["m1_delta_pp"]),
                "" if base_row else fmt_pp_ci(row["m1_delta_ci95_pp"]),
                "" if base_row else f"{row['m1_p']:.4g} ({row['m1_p_holm']:.4g})",
                "" if base_row or row["m1_mde_pp"] is None else f"{row['m1_mde_pp']:.1f} pp",
                fmt_rate(row["m2"]),
                fmt_m2_ci(row["m2"]),
            ]
        )
    lines += columns(rows)
    for pair in result["runs"]:
        lines += [
            "",
            f"== {pair['b']['label']} vs baseline {base['label']} ==",
            format_comparison(pair),
        ]
    return "\n".join(lines)
