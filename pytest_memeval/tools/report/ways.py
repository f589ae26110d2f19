"""The page of one model (or several) measured three ways: ``memeval report`` on scenario runs
and closed-loop runs of the same seeds together.

The comparison is :mod:`pytest_memeval.tools.compare`'s (``compare_ways``): the table of m2
teacher-forced, m2 free-running, the final scene question (m1) and closed-loop success with
their intervals; whether per-turn accuracy carried over to success, seed by seed (a two-by-two
table per model with the seeds in each cell); the same by slice; and every seed's outcome
each way. The template (``templates/ways.html``) is autoescaped: ids and tags are printed as
text.

:func:`ways_markdown` is the same comparison as Markdown (``memeval report --format
markdown``), for a CI job page or a pull-request comment: the table, the carry-over in words,
the slices asked for, and the seeds where "every turn right" and the environment disagree (a
reviewer's first look; every seed is on the HTML page). Labels, ids and tags are escaped as
:mod:`.markdown` escapes all outside text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.records import RateBlock
from pytest_memeval.tools.compare import (
    DIFFERENCE_HEADER,
    ModelWays,
    SeedRow,
    SeedWays,
    WaysComparison,
    difference_rows,
    fmt_ci,
    fmt_rate,
    rate_cell,
)
from pytest_memeval.tools.report.markdown import ROWS, md_code, md_table, md_text
from pytest_memeval.tools.report.pages import generated_at, page_csp
from pytest_memeval.tools.report.templating import render

__all__ = ["render_ways_report", "ways_markdown"]

#: The columns of a rate table, after the first
_RATE_COLUMNS = ("m2 teacher-forced", "m2 free-running", "m1 final question", "success")


class _Cell(NamedTuple):
    """A rate as the page shows it: the count and percent, and the interval below."""

    value: str
    interval: str


def _cell(block: RateBlock | None) -> _Cell:
    if block is None:
        return _Cell("-", "")
    interval = fmt_ci(block)
    return _Cell(fmt_rate(block), "" if interval == "-" else interval)


def _row(model: ModelWays) -> list[_Cell]:
    return [
        _cell(model["m2_teacher_forced"]),
        _cell(model["m2_free_running"]),
        _cell(model["m1"]),
        _cell(model["success"]),
    ]


def _fraction(value: float | None) -> str:
    return "-" if value is None else percent(value, 1)


def _seed_cells(seed: SeedWays) -> list[str]:
    """Teacher-forced turns, free-running, the final question, the closed loop."""
    if seed["free_running_reproduced"] is None:
        free = "-"
    elif seed["free_running_reproduced"]:
        free = "gold path reproduced"
    else:
        free = f"left it at turn {seed['free_running_left_at']}"
    return [
        f"{seed['turns_right']}/{seed['turns_scored']}",
        free,
        "right" if seed["final_match"] else "wrong",
        f"{seed['reason']} after {seed['steps']}",
    ]


def render_ways_report(result: WaysComparison, paths: Sequence[str]) -> str:
    """The self-contained HTML page of a three-ways comparison (no script, loads nothing)."""
    models = result["models"]
    return render(
        "ways.html",
        title="memeval: " + ", ".join(m["label"] for m in models) + ", three ways",
        csp=page_csp(None),
        generated=generated_at(),
        seeds=result["seeds"],
        paths=list(paths),
        models=[(m, _row(m)) for m in models],
        fraction=_fraction,
        differences=difference_rows(result["differences"]),
        differences_against=result["differences"][0]["a"] if result["differences"] else "",
        differences_header=DIFFERENCE_HEADER,
        slices=[(s["tag"], s["n"], [(m, _row(m)) for m in s["models"]]) for s in result["slices"]],
        by_seed=[
            (row["id"], row["tags"], [(m, _seed_cells(m)) for m in row["models"]])
            for row in result["by_seed"]
        ],
    )


# -- Markdown ---------------------------------------------------------------------------------


def _md_rates(model: ModelWays) -> list[str]:
    """The four rates of a row, each with its interval, as every comparison words them."""
    return [
        rate_cell(model["m2_teacher_forced"]),
        rate_cell(model["m2_free_running"]),
        rate_cell(model["m1"]),
        rate_cell(model["success"]),
    ]


def _md_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(md_code(i, table=False) for i in ids[:ROWS])
    return shown + (f" and {len(ids) - ROWS} more" if len(ids) > ROWS else "")


def _md_carryover(model: ModelWays) -> list[str]:
    """The seeds' verdict on per-turn accuracy predicting success, as the terminal words it."""
    carry = model["carryover"]
    label = md_text(model["label"])
    line = (
        f"- {label}: every turn right teacher-forced on {carry['both'] + carry['turns_only']} "
        f"of {carry['seeds']} seeds, {carry['both']} of them succeeded in the environment"
    )
    if carry["turns_only_ids"]:
        line += f"; failed: {_md_ids(carry['turns_only_ids'])}"
    lines = [line]
    if carry["success_only_ids"]:
        lines.append(f"  - a wrong turn, yet succeeded: {_md_ids(carry['success_only_ids'])}")
    if carry["agreement"] is not None:
        lines.append(
            f"  - 'every turn right' agreed with the environment on "
            f"{percent(carry['agreement'], 1)} of the seeds"
        )
    reproduced = model["free_running_reproduced"]
    if reproduced is not None and reproduced["failed_ids"]:
        lines.append(
            "  - free-running reproduced the gold path, yet failed in the closed loop (runs of "
            f"different settings): {_md_ids(reproduced['failed_ids'])}"
        )
    return lines


def _disagreeing(rows: Sequence[SeedRow]) -> list[list[str]]:
    """Each seed and model where every-turn-right and success disagree, with its outcomes."""
    found = []
    for row in rows:
        for seed in row["models"]:
            if (seed["turns_right"] == seed["turns_scored"]) != seed["success"]:
                cells = [md_text(c, table=True) for c in _seed_cells(seed)]
                found.append([md_code(row["id"]), md_text(seed["label"], table=True), *cells])
    return found


def ways_markdown(result: WaysComparison) -> str:
    """The three-ways comparison as Markdown: the rates with their intervals, the carry-over
    in words, the slices asked for, and the seeds where the turns and the environment
    disagree (at most :data:`~.markdown.ROWS`)."""
    models = result["models"]
    lines = [
        f"### memeval: {md_text(', '.join(m['label'] for m in models))}, three ways",
        "",
        f"The same {result['seeds']} seeds each way (paired by id); 95% intervals: m2 "
        "clustered by scenario, m1 and success Wilson.",
        "",
        *md_table(
            ["model", *_RATE_COLUMNS],
            [[md_text(m["label"], table=True), *_md_rates(m)] for m in models],
        ),
        "Does per-turn accuracy carry over to success? Seed by seed:",
        "",
    ]
    for model in models:
        lines += _md_carryover(model)
    lines.append("")
    if result["slices"]:
        rows = [
            [md_code(s["tag"]), str(s["n"]), md_text(m["label"], table=True),
             *_md_rates(m)]
            for s in result["slices"]
            for m in s["models"]
        ]  # fmt: skip
        lines += md_table(["slice", "seeds", "model", *_RATE_COLUMNS], rows)
    if result["differences"]:
        lines += [
            f"Paired against {md_text(result['differences'][0]['a'])} (A), seed by seed; p "
            "Holm-adjusted over each model's ways:",
            "",
            *md_table(
                DIFFERENCE_HEADER,
                [
                    [md_text(cell, table=True) for cell in row]
                    for row in difference_rows(result["differences"])
                ],
            ),
        ]
    disagree = _disagreeing(result["by_seed"])
    lines += [f"Seeds where the turns and the environment disagree: {len(disagree)}", ""]
    if disagree:
        header = ["seed", "model", "turns right", "free-running", "final question", "closed loop"]
        lines += md_table(header, disagree[:ROWS])
        if len(disagree) > ROWS:
            lines.append(f"(and {len(disagree) - ROWS} more: every seed is on the HTML page)")
    return "\n".join(lines).rstrip("\n") + "\n"
