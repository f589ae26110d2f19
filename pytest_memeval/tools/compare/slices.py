"""Per-slice comparison of runs: where a change helps and where it hurts, without crying wolf.

For each slice shown (a tag, or ``TAG&TAG``: :mod:`pytest_memeval.core.slices`), over the
scenarios in it: each run's m1 (Wilson interval), the paired m1 difference with the exact
McNemar test, the paired m2 difference over the scenarios both runs score on the same turns
(:func:`~pytest_memeval.tools.compare.stats.paired_m2`: exact sign-flip permutation test), and the
smallest m1 difference the slice could detect, and the m1 difference's paired interval
(Newcombe) made simultaneous over the family (Bonferroni: level ``1 - alpha / m``).

A table of twenty slices is twenty tests: at 0.05 each, one flags by chance more often than
not. So every p-value of the table (m1 and m2, every slice, every run compared) forms **one
family** and is adjusted over it: Holm's step-down (default; the chance that *any* slice is
flagged when nothing changed stays under 5%) or Benjamini-Hochberg (``--correction bh``;
the expected share of false flags among the flagged stays under 5%). A slice's verdict
reads its adjusted p-values only. Its minimum detectable difference is stated at the level
the correction asks of a slice that differs alone, ``alpha / m`` for ``m`` tests: a slice
cannot be flagged for less. Formulas and references: docs/statistics.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TypedDict

from pytest_memeval.core.formatting import columns, score_text
from pytest_memeval.core.records import RateBlock
from pytest_memeval.core.slices import SliceSpec, merged_tags, select_slices
from pytest_memeval.core.stats import (
    CORRECTIONS,
    adjust_p,
    mcnemar_exact,
    mde_paired_binary,
    min_detectable_drop,
    normal_quantile,
    paired_diff_interval,
    rate_with_ci,
)
from pytest_memeval.core.tags import slice_order
from pytest_memeval.tools.compare.stats import paired_m2
from pytest_memeval.tools.compare.types import ALPHA, POWER, CompareError, PairedM2, RunData

__all__ = [
    "SliceComparison",
    "SliceCorrection",
    "SlicePair",
    "SliceRow",
    "compare_slices",
    "format_slices",
    "run_tags",
    "slice_arguments",
]


class _SliceRowFields(TypedDict):
    slice: str
    n: int
    a: RateBlock
    b: RateBlock
    m1_delta_pp: float | None
    m1_delta_ci_pp: list[float] | None
    fixed: int
    broken: int
    m1_p: float
    m1_p_adjusted: float
    m1_significant: bool
    m1_mde_pp: float | None
    m1_mde_basis: str
    m2: PairedM2
    m2_p_adjusted: float | None
    m2_significant: bool | None
    verdict: str


class SliceRow(_SliceRowFields):
    """One slice of one pair of runs (A the reference, B the candidate)."""


class SlicePair(TypedDict):
    """One run (B) against the reference (A), slice by slice."""

    a: str
    b: str
    tags_differ: int
    slices: list[SliceRow]


class SliceCorrection(TypedDict):
    """How the per-slice p-values were adjusted: one family over everything shown."""

    method: str
    controls: str
    alpha: float
    tests: int
    m1_tests: int
    m2_tests: int
    mde_alpha: float
    ci_level: float


class SliceComparison(TypedDict):
    """Per-slice comparison of one or several runs against a reference run."""

    membership: str
    correction: SliceCorrection
    pairs: list[SlicePair]


#: How a scenario gets into a slice when the runs tag it differently (core/slices.py).
MEMBERSHIP = "a scenario is in a slice when either run's record carries the tag"


def run_tags(*runs: RunData) -> list[str]:
    """Every tag of the runs' records, in the order slices are shown."""
    return slice_order(
        tag for run in runs for record in run.records.values() for tag in record.get("tags", ())
    )


def _slice_row(run_a: RunData, run_b: RunData, spec: SliceSpec, ids: list[str]) -> SliceRow:
    """The unadjusted numbers of one slice (``ids``: its scenarios, in A's order)."""
    fixed = broken = right_a = right_b = 0
    for sid in ids:
        ok_a = run_a.records[sid]["final_match"] is True
        ok_b = run_b.records[sid]["final_match"] is True
        right_a += ok_a
        right_b += ok_b
        fixed += ok_b and not ok_a
        broken += ok_a and not ok_b
    n = len(ids)
    return {
        "slice": spec.name,
        "n": n,
        "a": rate_with_ci(right_a, n),
        "b": rate_with_ci(right_b, n),
        "m1_delta_pp": (right_b - right_a) / n * 100 if n else None,
        "m1_delta_ci_pp": None,
        "fixed": fixed,
        "broken": broken,
        "m1_p": mcnemar_exact(fixed, broken),
        "m1_p_adjusted": 1.0,
        "m1_significant": False,
        "m1_mde_pp": None,
        "m1_mde_basis": "",
        "m2": paired_m2(run_a, run_b, ids),
        "m2_p_adjusted": None,
        "m2_significant": None,
        "verdict": "",
    }


#: ``m1_mde_basis``: the discordance Connor's formula was solved at.
OBSERVED = "observed discordant share"
BEST_CASE = "best case: every changed scenario changing one way"


def _mde(n: int, discordant: int, alpha: float) -> tuple[float | None, str]:
    """Connor's minimum detectable m1 difference (pp) at ``alpha`` and its basis.

    At the slice's observed share of changed scenarios, as for the whole benchmark
    (:func:`~pytest_memeval.tools.compare.stats.m1_power`); where that gives none (no changed
    scenario, or too few for the exact test to reject), the best case, which still says how
    large a difference must be before this slice could show it at all.
    """
    if discordant:
        mde = mde_paired_binary(n, discordant / n, alpha, POWER)
        if mde is not None:
            return mde * 100, OBSERVED
    best = min_detectable_drop(n, alpha, POWER)
    return (None if best is None else best * 100), BEST_CASE


def _change(metric: str, delta_pp: float, p_adjusted: float, extra: str = "") -> str:
    word = "drop" if delta_pp < 0 else "gain"
    return f"{metric} {word} of {abs(delta_pp):.1f} pp{extra}, adjusted p={p_adjusted:.2g}"


def _verdict(row: SliceRow, tests: int) -> str:
    """The slice in plain words, from its adjusted p-values only."""
    found = []
    delta = row["m1_delta_pp"]
    if row["m1_significant"] and delta is not None:
        found.append(_change("m1", delta, row["m1_p_adjusted"]))
    m2, m2_adj = row["m2"], row["m2_p_adjusted"]
    if row["m2_significant"] and m2["delta_pp"] is not None and m2_adj is not None:
        extra = f" over {m2['scenarios']} scenarios' turns"
        found.append(_change("m2", m2["delta_pp"], m2_adj, extra))
    if found:
        return "; ".join(found)
    text = f"no detectable difference at n={row['n']}"
    raw = [
        (name, p, adj)
        for name, p, adj in (
            ("m1", row["m1_p"], row["m1_p_adjusted"]),
            ("m2", m2["p_value"], m2_adj),
        )
        if p is not None and adj is not None and p < ALPHA
    ]
    if raw:
        shown = ", ".join(f"{name} raw p={p:.2g}, adjusted {adj:.2g}" for name, p, adj in raw)
        return f"{text}: significant alone, not after correcting for {tests} tests ({shown})"
    mde = row["m1_mde_pp"]
    if mde is None:
        return f"{text}: too few scenarios for any m1 difference to be detectable"
    return f"{text} (m1 differences under about {mde:.0f} pp are not detectable here)"


def _correct(pairs: list[SlicePair], method: str) -> SliceCorrection:
    """Adjust every p-value of ``pairs`` as one family; then MDEs and verdicts."""
    rows = [row for pair in pairs for row in pair["slices"]]
    m1 = [row["m1_p"] for row in rows]
    m2_rows = [row for row in rows if row["m2"]["p_value"] is not None]
    m2 = [p for row in m2_rows if (p := row["m2"]["p_value"]) is not None]
    adjusted = adjust_p(m1 + m2, method)
    tests = len(adjusted)
    for row, adj in zip(rows, adjusted[: len(m1)], strict=True):
        row["m1_p_adjusted"] = adj
        row["m1_significant"] = adj < ALPHA
    for row, adj in zip(m2_rows, adjusted[len(m1) :], strict=True):
        row["m2_p_adjusted"] = adj
        row["m2_significant"] = adj < ALPHA
    mde_alpha = ALPHA / max(1, tests)
    z = normal_quantile(1 - mde_alpha / 2)
    for row in rows:
        discordant = row["fixed"] + row["broken"]
        row["m1_mde_pp"], row["m1_mde_basis"] = _mde(row["n"], discordant, mde_alpha)
        both = row["a"]["correct"] - row["broken"]
        neither = row["n"] - both - discordant
        low, high = paired_diff_interval(both, row["fixed"], row["broken"], neither, z)
        row["m1_delta_ci_pp"] = [low * 100, high * 100]
        row["verdict"] = _verdict(row, tests)
    return {
        "method": method,
        "controls": CORRECTIONS[method][1],
        "alpha": ALPHA,
        "tests": tests,
        "m1_tests": len(m1),
        "m2_tests": len(m2),
        "mde_alpha": mde_alpha,
        "ci_level": 1 - mde_alpha,
    }


def compare_slices(
    reference: RunData,
    runs: Sequence[RunData],
    labels: Sequence[str],
    *,
    slices: Sequence[str] = (),
    method: str = "holm",
) -> SliceComparison:
    """Each of ``runs`` against ``reference``, slice by slice, as plain JSON data.

    ``labels``: the reference's and each run's (as the whole comparison names them);
    ``slices``: slice expressions (:func:`~pytest_memeval.core.slices.select_slices`;
    default every tag of the runs); ``method``: ``holm`` or ``bh``. The runs must cover the
    same scenarios (the whole comparison checks that first). Raises :class:`CompareError`
    for a slice expression that names no slice, or one with no scenario.
    """
    if method not in CORRECTIONS:
        raise CompareError(f"unknown correction {method!r} (one of {', '.join(CORRECTIONS)})")
    known = run_tags(reference, *runs)
    try:
        specs = select_slices(slices, known)
    except ValueError as exc:
        raise CompareError(str(exc)) from None
    pairs: list[SlicePair] = []
    for run, label in zip(runs, labels[1:], strict=True):
        ids = list(reference.records)
        tags = {sid: merged_tags(reference.records[sid], run.records[sid]) for sid in ids}
        differ = sum(
            1
            for sid in ids
            if set(reference.records[sid].get("tags", ())) != set(run.records[sid].get("tags", ()))
        )
        rows = []
        for spec in specs:
            members = [sid for sid in ids if spec.holds(tags[sid])]
            if not members:
                raise CompareError(f"slice {spec.name!r}: no scenario carries all of its tags")
            rows.append(_slice_row(reference, run, spec, members))
        pairs.append({"a": labels[0], "b": label, "tags_differ": differ, "slices": rows})
    correction = _correct(pairs, method)
    return {"membership": MEMBERSHIP, "correction": correction, "pairs": pairs}


def slice_arguments(parser: argparse.ArgumentParser) -> None:
    """``--slice`` and ``--correction``, for ``memeval compare`` and ``memeval report``."""
    parser.add_argument(
        "--slice",
        dest="slices",
        action="append",
        default=[],
        metavar="EXPR",
        help="compare this slice: a tag (query:door-state), a glob (query:*) or the scenarios "
        "carrying several tags (query:door-state&oracle:close-dropped); repeatable. Default: "
        "every tag. The p-values are adjusted over the slices shown",
    )
    parser.add_argument(
        "--correction",
        choices=tuple(CORRECTIONS),
        default="holm",
        help="multiplicity adjustment of the per-slice p-values: holm (family-wise error, "
        "default) or bh (Benjamini-Hochberg, false discovery rate)",
    )


# -- text ----------------------------------------------------------------------------------


def _p_cell(p: float | None, adjusted: float | None) -> str:
    return "-" if p is None or adjusted is None else f"{p:.2g} ({adjusted:.2g})"


def _delta_cell(row: SliceRow) -> str:
    delta, ci = row["m1_delta_pp"], row["m1_delta_ci_pp"]
    if delta is None:
        return "n/a"
    return f"{delta:+.2f} pp" + ("" if ci is None else f" [{ci[0]:+.1f}, {ci[1]:+.1f}]")


def _m2_cell(m2: PairedM2) -> str:
    if m2["delta_pp"] is None:
        return "not comparable"
    return f"{m2['delta_pp']:+.2f} pp over {m2['scenarios']}"


def _table(pair: SlicePair) -> list[str]:
    rows = [
        [
            "slice",
            "n",
            "A m1",
            "B m1",
            "m1 delta [simultaneous CI]",
            "fixed/broken",
            "McNemar p (adj.)",
            "m1 MDE",
            "m2 paired delta",
            "m2 p (adj.)",
        ]
    ]
    for row in pair["slices"]:
        a, b = row["a"], row["b"]
        rows.append(
            [
                row["slice"],
                str(row["n"]),
                score_text(a["correct"], a["total"], a["rate"]),
                score_text(b["correct"], b["total"], b["rate"]),
                _delta_cell(row),
                f"{row['fixed']}/{row['broken']}",
                _p_cell(row["m1_p"], row["m1_p_adjusted"]),
                "n/a" if row["m1_mde_pp"] is None else f"{row['m1_mde_pp']:.1f} pp",
                _m2_cell(row["m2"]),
                _p_cell(row["m2"]["p_value"], row["m2_p_adjusted"]),
            ]
        )
    return columns(rows)


def format_slices(result: SliceComparison) -> str:
    """The per-slice section of ``memeval compare`` (and the lines the report shows)."""
    corr = result["correction"]
    method = "Holm" if corr["method"] == "holm" else "Benjamini-Hochberg"
    lines = [
        f"slices: {result['membership']}; p-values {method}-adjusted over the {corr['tests']} "
        f"tests shown ({corr['m1_tests']} m1, {corr['m2_tests']} m2: {corr['controls']} at "
        f"{corr['alpha']:g})",
        f"  m1 MDE: the smallest m1 difference detectable at 80% power at the level the "
        f"correction asks of a slice that differs alone (alpha/{corr['tests']} = "
        f"{corr['mde_alpha']:.2g}); the m1 delta's interval is paired (Newcombe) at "
        f"{corr['ci_level']:.2%}, so that all the slices' intervals hold together with 95% "
        "confidence (Bonferroni)",
    ]
    for pair in result["pairs"]:
        lines.append("")
        if len(result["pairs"]) > 1:
            lines.append(f"== {pair['b']} vs {pair['a']}, by slice ==")
        if pair["tags_differ"]:
            lines.append(
                f"note: the runs tag {pair['tags_differ']} scenario(s) differently (e.g. tags "
                "only one variant of the benchmark can know); each is in the slices of both"
            )
        lines += _table(pair)
        lines.append("verdicts (B - A):")
        width = max(len(row["slice"]) for row in pair["slices"])
        lines += [f"  {row['slice'].ljust(width)}  {row['verdict']}" for row in pair["slices"]]
    return "\n".join(lines)
