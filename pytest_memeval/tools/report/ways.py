"""The page of one model (or several) measured three ways: ``memeval report`` on scenario runs
and closed-loop runs of the same seeds together.

The comparison is :mod:`pytest_memeval.tools.compare`'s (``compare_ways``): the table of m2
teacher-forced, m2 free-running, the final scene question (m1) and closed-loop success with
their intervals; whether per-turn accuracy carried over to success, seed by seed (a two-by-two
table per model with the seeds in each cell); the same by slice; and every seed's outcome
each way. The template (``templates/ways.html``) is autoescaped: ids and tags are printed as
text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.records import RateBlock
from pytest_memeval.tools.compare import ModelWays, SeedWays, WaysComparison, fmt_ci, fmt_rate
from pytest_memeval.tools.report.pages import generated_at, page_csp
from pytest_memeval.tools.report.templating import render

__all__ = ["render_ways_report"]


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
        slices=[(s["tag"], s["n"], [(m, _row(m)) for m in s["models"]]) for s in result["slices"]],
        by_seed=[
            (row["id"], row["tags"], [(m, _seed_cells(m)) for m in row["models"]])
            for row in result["by_seed"]
        ],
    )
