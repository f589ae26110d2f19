"""Scenario by scenario: what a record was asked, what it scores, and how two runs differ.

A scenario's *turn structure* (:func:`turn_structure`) is what the model was asked; two runs
*diverge* on a scenario when it differs. Its m2 score (:func:`scored_turns`) counts only
aligned scenarios. :func:`diff_scenarios` walks two runs' records in benchmark order and
collects the scenarios whose m1 outcome flipped, that diverge, or whose final ground truth
differs: the per-scenario facts the statistics and the notes of a pair are built on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pytest_memeval.core.records import Record
from pytest_memeval.tools.compare.types import RunData

__all__ = ["ScenarioDiff", "TurnScore", "diff_scenarios", "scored_turns", "turn_structure"]


class TurnScore(NamedTuple):
    """A record's m2 turns: how many were right of how many were scored (a cluster's
    ``(y_c, n_c)`` for :class:`~pytest_memeval.core.stats.ClusterSums`)."""

    right: int
    scored: int


@dataclass
class ScenarioDiff:
    """The scenarios of a pair, by what changed between run A and run B (A's order)."""

    #: m1 wrong in A, right in B
    fixed: list[str] = field(default_factory=list)
    #: m1 right in A, wrong in B
    broken: list[str] = field(default_factory=list)
    #: a different turn structure (:func:`turn_structure`)
    divergent: list[str] = field(default_factory=list)
    #: a different final ground truth: m1 is not the same question there
    answer_differs: list[str] = field(default_factory=list)


def turn_structure(record: Record) -> tuple[str, ...]:
    """The turn structure a record was evaluated on: its turns' training targets, in order.

    Two runs *diverge* on a scenario when these differ: a different number of turns, or a
    turn with different content (e.g. an "open cabinet" inserted by the door-grounded data).
    Predictions play no part: the structure is what the model was asked, not what it said.
    """
    return tuple(str(turn.get("target", turn.get("gt"))) for turn in record["turns"])


def scored_turns(record: Record) -> TurnScore:
    """(right, scored) turns of a record for m2: aligned scenarios only."""
    if record.get("aligned") is not True:
        return TurnScore(0, 0)
    scored = [t["match"] for t in record["turns"] if t["match"] is not None]
    return TurnScore(sum(m is True for m in scored), len(scored))


def diff_scenarios(run_a: RunData, run_b: RunData, ids: Sequence[str]) -> ScenarioDiff:
    """The scenarios ``ids`` (both runs have each) sorted by what changed from A to B."""
    diff = ScenarioDiff()
    for sid in ids:
        rec_a, rec_b = run_a.records[sid], run_b.records[sid]
        ok_a, ok_b = rec_a["final_match"] is True, rec_b["final_match"] is True
        if ok_b and not ok_a:
            diff.fixed.append(sid)
        elif ok_a and not ok_b:
            diff.broken.append(sid)
        if turn_structure(rec_a) != turn_structure(rec_b):
            diff.divergent.append(sid)
        if rec_a.get("final_gt") != rec_b.get("final_gt"):
            diff.answer_differs.append(sid)
    return diff
