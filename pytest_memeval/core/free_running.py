"""A free-running run beside its teacher-forced run: what the summary and the report show.

A free-running run (``--memeval-history model``) is written to ``runs/<ckpt>@history-model``,
beside the teacher-forced run of the same checkpoint in ``runs/<ckpt>``. The terminal summary
of a free-running run and ``memeval report`` read that run when it exists (finished, of the
same benchmark, weights and decoding settings: :func:`teacher_forced_beside`) and show m2 by
turn position for both histories side by side, with where the scenarios first left the truth
(:func:`position_rows`): the error-propagation curve of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_memeval.core.formatting import percent, score_text
from pytest_memeval.core.history import (
    HISTORY_TRUTH,
    history_of,
    other_differences,
    teacher_forced_sibling_name,
)
from pytest_memeval.core.records import LeftTruth, Metrics, PositionCounts
from pytest_memeval.core.results import RunLoadError, load_checked_run

__all__ = [
    "MAX_ROWS",
    "PositionRow",
    "TeacherForcedBeside",
    "left_truth_words",
    "position_rows",
    "position_table",
    "teacher_forced_beside",
]

#: Most rows of the terminal's by-position table: positions are grouped to fit.
MAX_ROWS = 10


@dataclass(frozen=True)
class TeacherForcedBeside:
    """The teacher-forced run of a free-running run's checkpoint: its metrics when found and
    usable, else ``None``, and a note saying which run it is or why none is shown."""

    path: Path | None
    metrics: Metrics | None
    note: str


def teacher_forced_beside(run_dir: Path, metrics: Metrics) -> TeacherForcedBeside:
    """The finished teacher-forced run beside the free-running run in ``run_dir`` (whose
    metrics are ``metrics``): ``runs/<ckpt>`` for ``runs/<ckpt>@history-model``.

    Shown only when it passes the recount, is complete and teacher-forced, and evaluates the
    same checkpoint on the same scenarios (:func:`~.history.other_differences` is empty);
    otherwise the note says why not.
    """
    name = teacher_forced_sibling_name(run_dir.name)
    if name is None:
        return TeacherForcedBeside(
            None,
            None,
            f"no teacher-forced run to show beside it: {run_dir.name} is not a "
            "'<ckpt>@history-model' directory (compare two runs with memeval compare)",
        )
    path = run_dir.parent / name
    try:
        run = load_checked_run(path)
    except RunLoadError:
        return TeacherForcedBeside(
            path,
            None,
            f"no finished teacher-forced run in {path} (a teacher-forced run of this "
            "checkpoint there would be shown beside this one)",
        )
    theirs = run.metrics
    why = ""
    if history_of(theirs) != HISTORY_TRUTH:
        why = "it is not teacher-forced"
    elif theirs.get("complete") is not True:
        why = "it is not a complete run"
    else:
        differ = other_differences(theirs, metrics, labels=("there", "here"))
        if differ:
            why = "it evaluates something else: " + "; ".join(differ)
    if why:
        return TeacherForcedBeside(path, None, f"the run in {path} is not shown beside it: {why}")
    return TeacherForcedBeside(path, theirs, f"teacher-forced run of this checkpoint: {path}")


@dataclass(frozen=True)
class PositionRow:
    """One row of the by-position table: turn positions ``first``..``last`` (``None``: the
    scenarios that never left the truth)."""

    first: int | None
    last: int | None
    free_running: PositionCounts | None
    teacher_forced: PositionCounts | None
    left_truth: int

    @property
    def label(self) -> str:
        if self.first is None:
            return "never"
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def _summed(counts: Mapping[str, PositionCounts], first: int, last: int) -> PositionCounts | None:
    slots = [counts[str(p)] for p in range(first, last + 1) if str(p) in counts]
    if not slots:
        return None
    return {"correct": sum(s["correct"] for s in slots), "total": sum(s["total"] for s in slots)}


def position_rows(
    free_running: Metrics, teacher_forced: Metrics | None, max_rows: int = MAX_ROWS
) -> list[PositionRow]:
    """m2 by turn position of a free-running run (and of its teacher-forced run), and how
    many scenarios first left the truth there, positions grouped into at most ``max_rows``
    rows of equal width; a last row for the scenarios that never left it."""
    fr = free_running.get("m2_by_position") or {}
    tf = (teacher_forced.get("m2_by_position") or {}) if teacher_forced is not None else {}
    left = free_running.get("left_truth")
    at = left["at"] if left is not None else {}
    positions = [int(p) for p in (*fr, *tf, *at)]
    if not positions:
        return []
    top = max(positions)
    width = max(1, -(-(top + 1) // max_rows))
    rows = []
    for first in range(0, top + 1, width):
        last = min(top, first + width - 1)
        rows.append(
            PositionRow(
                first,
                last,
                _summed(fr, first, last),
                _summed(tf, first, last) if teacher_forced is not None else None,
                sum(at.get(str(p), 0) for p in range(first, last + 1)),
            )
        )
    if left is not None:
        rows.append(PositionRow(None, None, None, None, left["never"]))
    return rows


def _cell(counts: PositionCounts | None) -> str:
    if counts is None or not counts["total"]:
        return "-"
    return score_text(counts["correct"], counts["total"], counts["correct"] / counts["total"])


def position_table(free_running: Metrics, beside: TeacherForcedBeside) -> list[list[str]]:
    """The by-position table as text cells, header first (``columns`` lays it out)."""
    rows = position_rows(free_running, beside.metrics)
    table = [["turn", "m2 free-running", "m2 teacher-forced", "first left the truth"]]
    for row in rows:
        table.append(
            [
                row.label,
                "" if row.first is None else _cell(row.free_running),
                "" if row.first is None else _cell(row.teacher_forced),
                str(row.left_truth),
            ]
        )
    return table


def left_truth_words(left: LeftTruth, n: int) -> str:
    """``148/189 scenarios left the truth at some turn (first departure at turn 3, median);
    of the turns after it, 120/431 were still right (27.84%, aligned scenarios)``."""
    at = {int(k): v for k, v in left["at"].items()}
    left_n = sum(at.values())
    words = f"{left_n}/{n} scenarios left the truth at some turn"
    if left_n:
        ordered = sorted(p for p, count in at.items() for _ in range(count))
        words += f" (first departure at turn {ordered[(left_n - 1) // 2]}, median)"
    still = left["still_right"]
    if still["total"]:
        words += (
            f"; of the turns after it, {still['correct']}/{still['total']} were still right "
            f"({percent(still['correct'] / still['total'])}, aligned scenarios)"
        )
    return words
