"""pytest-html's memeval pieces, rendered: the summary block and a scenario's extra.

:func:`summary_html` is the block above pytest-html's results table (m1, m2 with their
intervals, the gate; a free-running run's departures from the truth and m2 by turn position);
:func:`scenario_detail_html` is an eval item's extra (the final prompt's end, prediction
against truth, the turn table). Both are autoescaped templates (``summary.html``,
``scenario_detail.html``); :mod:`.plugin` is the plugin that puts them on the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from pytest_memeval.core.free_running import (
    left_truth_words,
    position_table,
    teacher_forced_beside,
)
from pytest_memeval.core.history import HISTORY_MODEL, describe_history, history_of
from pytest_memeval.core.records import Metrics, Record
from pytest_memeval.core.stats import interval_words, rate_with_ci
from pytest_memeval.tools.compare import fmt_rate
from pytest_memeval.tools.report.templating import render

if TYPE_CHECKING:
    from pytest_memeval.tools.gate import GateOutcome

__all__ = ["scenario_detail_html", "summary_html"]


def scenario_detail_html(record: Record) -> str:
    """One scenario for a pytest-html extra: prompt end, prediction vs truth, turn table."""
    wrong = sum(t.get("match") is False for t in record.get("turns", ()))
    return render("scenario_detail.html", record=record, wrong=wrong)


class SummaryRow(NamedTuple):
    """A metric of the summary table: its name, its count and rate, its 95% interval in words."""

    name: str
    rate: str
    interval: str


class FreeRunning(TypedDict):
    """A free-running run's part of the summary: its history, where it left the truth, the
    note on the teacher-forced run beside it and the by-position table (header first)."""

    history: str
    left: str
    note: str
    table: list[list[str]]


def summary_html(
    metrics: Metrics | None, gate: GateOutcome | None, run_dir: Path | None = None
) -> str:
    """The memeval block above pytest-html's results table: m1, m2, intervals, the gate; for
    a free-running run in ``run_dir``, where it left the truth and m2 by turn position beside
    the teacher-forced run of the checkpoint (when there is one)."""
    rows: list[SummaryRow] = []
    free_running: FreeRunning | None = None
    if metrics is not None:
        for name, block in (("m1 final-query", metrics["m1"]), ("m2 turn-level", metrics["m2"])):
            if "ci95" not in block:  # a metrics.json from before the intervals were written
                block = rate_with_ci(block["correct"], block["total"])
            rows.append(SummaryRow(name, fmt_rate(block), interval_words(block) or "-"))
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
