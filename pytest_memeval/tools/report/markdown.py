"""A run's result as Markdown: for the CI job page and for pull-request comments.

The same text goes to GitHub Actions' ``$GITHUB_STEP_SUMMARY`` (or ``--memeval-summary-md``,
step_summary.py) at the end of a pytest run and comes out of ``memeval report --format
markdown``: m1 and m2 with their 95% intervals, whether the run is complete, the gate's
verdict and each check's reason, the comparison with a baseline (paired differences with
their intervals, p-values, the minimum detectable difference), and tables of the scenarios a
reviewer looks at first (broken against the baseline, or wrong). No links anywhere.

**Escaping.** Model and benchmark text (predictions, truths, scenario ids) and user text
(labels, paths) are data, never Markdown. GitHub renders step summaries and comments as
GitHub Flavored Markdown with HTML, tables and autolinks, so a prediction could otherwise end a
table row (a newline), split a cell (``|``), open a link (``[x](javascript:…)``, a bare
``https://…``), a heading (``#``) or an HTML element (``<script>``, ``<img>``).
:func:`md_code` prints such text as a code span, where nothing is markup (no emphasis, link,
autolink, entity or HTML), with a fence longer than any run of backticks inside, ``|``
escaped (GFM splits table cells before it parses code spans), line breaks shown as ``↵``,
control and bidirectional-override characters replaced, and long text cut.
:func:`md_text` escapes text that stays prose (a gate's reason naming a path, notes naming
scenario ids): the characters that open inline Markdown backslash-escaped, which CommonMark
defines as the character itself, autolinks broken, words with ``@`` as code. The numbers' own
wording (``127/189 = 67.20%``, intervals, p-value statements) holds no outside text and is
printed as it is.
tests/unit/test_summary_md.py renders hostile predictions with GitHub's own renderer
(cmark-gfm) and checks the table and the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_memeval.core.formatting import percent, shown_ids
from pytest_memeval.core.free_running import left_truth_words
from pytest_memeval.core.history import HISTORY_TRUTH, history_of
from pytest_memeval.core.records import Metrics, RateBlock, Record
from pytest_memeval.core.stats import interval_words, rate_with_ci
from pytest_memeval.tools.compare import (
    Comparison,
    ManyComparison,
    compare_many,
    compare_runs,
    fmt_ci,
    fmt_m2_ci,
    fmt_pp,
    fmt_pp_ci,
    fmt_rate,
    format_history_pair,
    history_pair,
    load_run,
)
from pytest_memeval.tools.gate import GateOutcome

__all__ = [
    "ROWS",
    "TEXT_LIMIT",
    "MarkdownRun",
    "gate_lines",
    "many_markdown",
    "markdown_report",
    "md_code",
    "md_table",
    "md_text",
    "run_markdown",
]

#: The most scenarios a table lists (a job summary is read, not searched: the HTML report is)
ROWS = 20
#: The most characters of one model or benchmark text a cell shows
TEXT_LIMIT = 160

#: the ASCII punctuation that can open inline Markdown (CommonMark, GFM tables and tildes)
_INLINE = frozenset("\\`*_[]<>&!|~#")
#: bidirectional embeddings, overrides and isolates, and the marks: they reorder what a reader
#: sees around them (a prediction could make a cell read differently from what it holds)
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_NEWLINES = re.compile(r"\r\n|\r|\n|\u2028|\u2029|\x85")
_REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


def _printable(text: str) -> str:
    """Line breaks as ``↵``, tabs as a space, other control and bidi characters as ``�``."""
    text = _NEWLINES.sub("↵", text).replace("\t", " ")
    return "".join(
        _REPLACEMENT if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in _BIDI) else c for c in text
    )


def _escape_word(word: str) -> str:
    # CommonMark reads a backslash before ASCII punctuation as that character itself.
    word = "".join("\\" + c if c in _INLINE else c for c in word)
    # GFM's autolinks start at "www." and at a scheme's "://": break both with an escape.
    word = re.sub(r"(?i)www\.", lambda m: m.group(0)[:-1] + "\\.", word)
    return word.replace("://", "\\://")


def md_text(text: str, *, table: bool = False) -> str:
    """``text`` as literal Markdown prose, for text that holds a path, an id or a label.

    The characters that open inline Markdown (emphasis, code, links and images, HTML and
    entities, strikethrough, table cells) are backslash-escaped, which CommonMark defines as
    the character itself, and so are the starts of GFM's autolinks (``www.``, ``://``); line
    breaks and control characters are made visible. A word holding ``@`` is printed as a code
    span instead (:func:`md_code`; ``table``: it sits in a table cell): GFM turns
    ``name@host.tld`` into a mail link after the escapes are read, so no escape prevents it (a
    run directory such as ``runs/oracle@ckpt-1.5`` would). The text is never at the start of
    a line (our lines start with our own words), where ``#``, ``-`` or ``1.`` could matter.
    """
    words = re.split(r"(\s+)", _printable(text))
    return "".join(
        md_code(word, limit=len(word), table=table) if "@" in word else _escape_word(word)
        for word in words
    )


def md_code(text: str, *, limit: int = TEXT_LIMIT, table: bool = True) -> str:
    """``text`` as a Markdown code span: shown exactly as its characters, never as markup.

    Cut to ``limit`` characters (``…`` and how many were left out); ``|`` escaped where the
    span sits in a table cell (``table``: GFM splits cells before it reads code spans, and
    turns ``\\|`` back into ``|``); empty text as *(empty)*.
    """
    shown = _printable(text)
    cut = ""
    if len(shown) > limit:
        cut = f" …(+{len(shown) - limit} characters)"
        shown = shown[:limit]
    if not shown:
        return "*(empty)*" + cut
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    # A span that starts or ends with a backtick or a space needs a space inside each fence
    # (CommonMark strips exactly one from each side when both are there).
    if (shown[0] in "` " or shown[-1] in "` ") and shown.strip(" "):
        shown = f" {shown} "
    if table:
        shown = shown.replace("|", "\\|")
    return f"{fence}{shown}{fence}{md_text(cut)}"


@dataclass(frozen=True)
class MarkdownRun:
    """A run to summarise: its label, where it is, its metrics and its records by id."""

    label: str
    path: Path
    metrics: Metrics
    records: Mapping[str, Record]


# -- pieces -----------------------------------------------------------------------------------


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines (cells already escaped), then a blank line."""
    return [_row(*header), _row(*["---"] * len(header)), *(_row(*r) for r in rows), ""]


def _block(block: RateBlock) -> RateBlock:
    # A metrics.json from before the intervals were written: compute them (as the report does).
    return block if "ci95" in block else rate_with_ci(block["correct"], block["total"])


def _status(m: Metrics) -> str:
    if m.get("complete") is True:
        return "**complete**"
    scope = m.get("scope") or {}
    shard = scope.get("shard")
    if isinstance(shard, dict) and shard:
        return f"**INCOMPLETE**: shard {md_text(str(shard.get('spec')))} (merge the shards)"
    parts = []
    if m.get("missing"):
        parts.append(f"{len(m['missing'])} selected scenario(s) without a result")
    if scope.get("subset"):
        parts.append(f"a subset: {scope.get('evaluated')} of {scope.get('in_scope')} selected")
    return "**INCOMPLETE**" + (f": {', '.join(parts)}" if parts else "")


def _metrics_table(m: Metrics) -> list[str]:
    m1, m2 = _block(m["m1"]), _block(m["m2"])
    rows = [
        # Our own wording of numbers (no model or user text): printed as it is.
        ["**m1** final-query", fmt_rate(m1), interval_words(m1).removeprefix("95% CI ")],
        [
            "**m2** turn-level (aligned scenarios)",
            fmt_rate(m2),
            interval_words(m2).removeprefix("95% CI "),
        ],
        ["unaligned scenarios", f"{m['unaligned']}/{m['n']}", ""],
        [
            "parse failures",
            f"final {m['parse_fail']['final']}, turns {m['parse_fail']['turns']}",
            "",
        ],
    ]
    return md_table(["", "result", "95% interval"], rows)


def gate_lines(gate: GateOutcome, exitstatus: int | None) -> list[str]:
    """The gate's verdict, warnings and checks as Markdown (a heading and a list)."""
    verdict = "✅ PASSED" if gate.passed else "❌ FAILED"
    status = f" (exit status {exitstatus})" if exitstatus is not None else ""
    lines = [f"### Gate: {verdict}{status}", ""]
    lines += [f"- ⚠️ WARN {md_text(w)}" for w in gate.warnings]
    lines += [f"- {'✅ PASS' if c.passed else '❌ FAIL'} {md_text(c.detail)}" for c in gate.checks]
    return [*lines, ""]


def _pair_table(pair: Comparison) -> list[str]:
    a, b, mc, m2 = pair["a"], pair["b"], pair["mcnemar"], pair["m2_paired"]
    rows = [
        [
            "m1",
            fmt_rate(a["m1"]),
            fmt_rate(b["m1"]),
            f"{fmt_pp(pair['m1_delta_pp'])} ({pair['m1_delta_scenarios']:+d} scenarios)",
            f"{fmt_pp_ci(pair['m1_delta_ci95_pp'])} (Newcombe)",
            f"exact McNemar: {mc['fixed']} fixed, {mc['broken']} broken; {mc['statement']}",
        ]
    ]
    if m2["delta_pp"] is not None and m2["a"] is not None and m2["b"] is not None:
        rows.append(
            [
                f"m2 paired: {m2['scenarios']} of {m2['of']} scenarios on the same turns "
                f"({m2['turns']} turns)",
                percent(m2["a"]),
                percent(m2["b"]),
                fmt_pp(m2["delta_pp"]),
                f"{fmt_pp_ci(m2['ci95_pp'])} (clustered by scenario)"
                if m2["ci95_pp"] is not None
                else "n/a",
                f"exact sign-flip permutation: {m2['statement']}",
            ]
        )
    else:
        rows.append(["m2 paired", "", "", "not comparable", "", m2["statement"]])
    rows.append(
        [
            "m2, each run's own scored turns (unpaired)",
            fmt_rate(a["m2"]),
            fmt_rate(b["m2"]),
            fmt_pp(pair["m2_delta_pp"]),
            "",
            "",
        ]
    )
    header = ["", "baseline", "this run", "difference", "95% interval", "paired test"]
    return md_table(header, rows)


def _comparison_lines(pair: Comparison, baseline: MarkdownRun, run: MarkdownRun) -> list[str]:
    lines = [
        f"### Against the baseline {md_code(baseline.label, table=False)} "
        f"({md_code(str(baseline.path), table=False)})",
        "",
        *_pair_table(pair),
        f"**Minimum detectable m1 difference**: {pair['m1_power']['statement']}.",
        "",
        f"Divergent: {pair['divergent']['count']}/{pair['divergent']['total']} scenarios have "
        "a different turn structure in the two runs (m2 is compared paired only where it is "
        "the same).",
        "",
    ]
    lines += [f"> note: {md_text(note)}" for note in pair["notes"]]
    if pair["notes"]:
        lines.append("")
    flips = pair["flips"]
    lines += _scenario_table(
        "Broken: right in the baseline, wrong in this run", flips["broken"], run, baseline
    )
    lines += _scenario_table(
        "Fixed: wrong in the baseline, right in this run", flips["fixed"], run, baseline
    )
    return lines


def _scenario_table(
    heading: str, ids: Sequence[str], run: MarkdownRun, baseline: MarkdownRun | None
) -> list[str]:
    shown = f"; the first {ROWS}" if len(ids) > ROWS else ""
    lines = [f"#### {heading} ({len(ids)}{shown})", ""]
    if not ids:
        return [*lines, "none", ""]
    header = ["scenario", "truth"] + (["baseline"] if baseline is not None else []) + ["this run"]
    rows = []
    for sid in ids[:ROWS]:
        rec = run.records[sid]
        row = [md_code(sid), md_code(rec["final_gt"])]
        if baseline is not None:
            row.append(_prediction(baseline.records[sid]))
        row.append(_prediction(rec))
        rows.append(row)
    return lines + md_table(header, rows)


def _prediction(rec: Record) -> str:
    text = md_code(rec["final_pred"])
    if rec.get("parse_fail"):
        reason = rec.get("parse_fail_reason")
        text += " (parse failure" + (f": {md_text(reason, table=True)})" if reason else ")")
    return text


# -- documents --------------------------------------------------------------------------------


def run_markdown(
    run: MarkdownRun,
    *,
    gate: GateOutcome | None = None,
    exitstatus: int | None = None,
    baseline: MarkdownRun | None = None,
    pair: Comparison | None = None,
    no_comparison: str | None = None,
) -> str:
    """The summary of one run: metrics, completeness, the gate (``gate``), the comparison
    with ``baseline`` (``pair``: :func:`compare_runs(baseline, run)`; ``no_comparison``: why
    there is none although a baseline was given), and the scenarios to look at."""
    m = run.metrics
    if gate is not None and gate.checks:
        title = "✅ gate passed" if gate.passed else "❌ gate failed"
    else:
        title = "complete" if m.get("complete") is True else "INCOMPLETE"
    decode = (m.get("decoding") or {}).get("path")
    facts = [f"{m['n']} scenarios, {_status(m)}"]
    if decode:
        facts.append(f"decode {md_code(str(decode), table=False)}")
    if history_of(m) != HISTORY_TRUTH:
        facts.append(f"history {md_code(history_of(m), table=False)} (free-running)")
    facts.append(f"run directory {md_code(str(run.path), table=False)}")
    if exitstatus is not None:
        facts.append(f"exit status {exitstatus}")
    lines = [f"## memeval: {md_code(run.label, table=False)}, {title}", "", " · ".join(facts), ""]
    lines += _metrics_table(m)
    if history_of(m) != HISTORY_TRUTH and "left_truth" in m:
        lines += [md_text(left_truth_words(m["left_truth"], m["n"])), ""]
    if m.get("missing"):
        lines += [f"Missing: {md_text(shown_ids(m['missing']))}", ""]
    if gate is not None:
        lines += gate_lines(gate, exitstatus)
    if pair is not None and baseline is not None:
        lines += _comparison_lines(pair, baseline, run)
    else:
        if no_comparison:
            lines += [f"No comparison with the baseline: {md_text(no_comparison)}", ""]
        wrong = [sid for sid, rec in run.records.items() if rec["final_match"] is not True]
        lines += _scenario_table("Wrong final answers", wrong, run, None)
    lines += [
        "<sub>pytest-memeval; model text is shown as code, cut at "
        f"{TEXT_LIMIT} characters; every scenario is in the HTML report.</sub>",
        "",
    ]
    return "\n".join(lines)


def many_markdown(result: ManyComparison) -> str:
    """Several runs against one baseline: the leaderboard (``memeval compare BASE RUN ...``)."""
    base = result["baseline"]
    k = len(result["runs"])
    lines = [
        f"## memeval: {k} run(s) against {md_code(base['label'], table=False)}",
        "",
        f"{result['n']} scenarios; paired p-values Holm-corrected over the {k} runs.",
        "",
    ]
    rows = []
    for r in result["leaderboard"]:
        is_base = r["baseline"]
        m1_mde = r.get("m1_mde_pp")
        rows.append(
            [
                str(r["rank"]),
                md_code(r["label"]) + (" (baseline)" if is_base else ""),
                fmt_rate(r["m1"]),
                fmt_ci(r["m1"]),
                "" if is_base else fmt_pp(r.get("m1_delta_pp")),
                "" if is_base else fmt_pp_ci(r.get("m1_delta_ci95_pp")),
                "" if is_base else f"{r['m1_p']:.4g} ({r['m1_p_holm']:.4g})",
                "" if is_base or m1_mde is None else f"{m1_mde:.1f} pp",
                fmt_rate(r["m2"]),
                fmt_m2_ci(r["m2"]),
            ]
        )
    header = [
        "#",
        "run",
        "m1 final-query",
        "m1 95% CI",
        "m1 delta",
        "delta 95% CI",
        "McNemar p (Holm)",
        "m1 MDE",
        "m2 turn-level",
        "m2 95% CI",
    ]
    lines += md_table(header, rows)
    return "\n".join(lines)


def markdown_report(paths: Sequence[Path]) -> str:
    """``memeval report RUN [RUN_B ...] --format markdown``: one run; B against the baseline
    A (as a job summary shows a run against ``--memeval-baseline``, without a gate); more
    runs: the leaderboard against the first. Raises CompareError as ``memeval report`` does."""
    runs = [load_run(path) for path in paths]
    if len(runs) > 2:
        return many_markdown(compare_many(runs[0], runs[1:]))
    if len(runs) == 1:
        run = runs[0]
        return run_markdown(MarkdownRun(run.ckpt, paths[0], run.metrics, run.records))
    pair = compare_runs(runs[0], runs[1])
    base, this = (
        MarkdownRun(summary["label"], path, run.metrics, run.records)
        for summary, path, run in zip((pair["a"], pair["b"]), paths, runs, strict=True)
    )
    text = run_markdown(this, baseline=base, pair=pair)
    histories = history_pair(runs[0], runs[1], pair)
    if histories is not None:
        # The two histories of one checkpoint: the gap, and the scenarios it derailed.
        text += (
            "\n"
            + "\n".join(
                f"- {md_text(line.strip())}" for line in format_history_pair(histories, pair["n"])
            )
            + "\n"
        )
    return text
