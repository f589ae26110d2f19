"""Teacher-forced against free-running: ``memeval compare RUN_TRUTH RUN_MODEL``.

Two runs of the same checkpoint on the same scenarios that differ only in their history
(``--memeval-history truth`` and ``model``) are a paired comparison of one question asked two
ways: how much does the model lose when its own earlier turns, mistakes included, are the
history (error propagation)? :func:`history_pair` reads it off the two runs' comparison
(:func:`~pytest_memeval.tools.compare.pair.compare_runs`, which refuses runs of two histories that
differ in anything else): the m1 and m2 gaps (free-running minus teacher-forced, whatever
order the runs were given in) with their paired intervals and exact paired tests (McNemar on
m1, the sign-flip permutation test on m2), the scenarios right teacher-forced but wrong
free-running (derailed) and the reverse (recovered), the scenarios that lost turns, and where
each run first left the truth.

One property is checked on the way: up to and including the first turn where the free-running
run left the truth, its prompts were the teacher-forced ones, so its outputs there must be the
teacher-forced run's (and a scenario that never left the truth must answer the final query
alike). A scenario where they are not was not decoded alike in the two runs (a decode path
that is not exact, other weights under the same fingerprint...), and the result names it.
"""

from __future__ import annotations

from typing import TypedDict

from pytest_memeval.core.formatting import score_text, shown_ids
from pytest_memeval.core.free_running import left_truth_words
from pytest_memeval.core.history import HISTORY_MODEL, fed_back, history_of
from pytest_memeval.core.records import LeftTruth, RateBlock, Record
from pytest_memeval.tools.compare.text import fmt_pp, fmt_pp_ci
from pytest_memeval.tools.compare.types import Comparison, RunData

__all__ = ["HistoryPair", "format_history_pair", "history_pair"]


class HistoryPair(TypedDict):
    """``history`` of ``memeval compare --json`` for a teacher-forced/free-running pair (null
    for two runs of one history). Gaps are free-running minus teacher-forced, in pp."""

    teacher_forced: str
    free_running: str
    m1: dict[str, RateBlock]
    m1_gap_pp: float | None
    m1_gap_ci95_pp: list[float] | None
    m1_p: float
    m1_statement: str
    m2_gap_pp: float | None
    m2_gap_ci95_pp: list[float] | None
    m2_p: float | None
    m2_statement: str
    m2_scenarios: int
    m2_turns: int
    derailed: list[str]
    recovered: list[str]
    lost_turns: list[str]
    gained_turns: list[str]
    left_truth: dict[str, LeftTruth | None]
    differs_before_departure: list[str]


def _negated(ci: list[float] | None) -> list[float] | None:
    return None if ci is None else [-ci[1], -ci[0]]


def history_pair(run_a: RunData, run_b: RunData, result: Comparison) -> HistoryPair | None:
    """The teacher-forced/free-running facts of a compared pair (``None`` unless the two runs
    differ in their history; :func:`~pytest_memeval.tools.compare.pair.compare_runs` has already
    refused a pair that differs in anything else)."""
    if history_of(run_a.metrics) == history_of(run_b.metrics):
        return None
    model_is_b = history_of(run_b.metrics) == HISTORY_MODEL
    tf, fr = (run_a, run_b) if model_is_b else (run_b, run_a)
    tf_label, fr_label = (
        (result["a"]["label"], result["b"]["label"])
        if model_is_b
        else (result["b"]["label"], result["a"]["label"])
    )
    sign = 1.0 if model_is_b else -1.0
    m2 = result["m2_paired"]
    lost, gained = [], []
    for sid, rec_tf in tf.records.items():
        rec_fr = fr.records[sid]
        if rec_tf["aligned"] is not True or rec_fr["aligned"] is not True:
            continue
        right_tf = sum(1 for t in rec_tf["turns"] if t["match"] is True)
        right_fr = sum(1 for t in rec_fr["turns"] if t["match"] is True)
        if right_fr < right_tf:
            lost.append(sid)
        elif right_fr > right_tf:
            gained.append(sid)
    flips = result["flips"]
    return {
        "teacher_forced": tf_label,
        "free_running": fr_label,
        "m1": {
            "teacher_forced": (result["a"] if model_is_b else result["b"])["m1"],
            "free_running": (result["b"] if model_is_b else result["a"])["m1"],
        },
        "m1_gap_pp": None if result["m1_delta_pp"] is None else sign * result["m1_delta_pp"],
        "m1_gap_ci95_pp": (
            result["m1_delta_ci95_pp"] if model_is_b else _negated(result["m1_delta_ci95_pp"])
        ),
        "m1_p": result["mcnemar"]["p_value"],
        "m1_statement": result["mcnemar"]["statement"],
        "m2_gap_pp": None if m2["delta_pp"] is None else sign * m2["delta_pp"],
        "m2_gap_ci95_pp": m2["ci95_pp"] if model_is_b else _negated(m2["ci95_pp"]),
        "m2_p": m2["p_value"],
        "m2_statement": m2["statement"],
        "m2_scenarios": m2["scenarios"],
        "m2_turns": m2["turns"],
        "derailed": flips["broken"] if model_is_b else flips["fixed"],
        "recovered": flips["fixed"] if model_is_b else flips["broken"],
        "lost_turns": lost,
        "gained_turns": gained,
        "left_truth": {
            "teacher_forced": tf.metrics.get("left_truth"),
            "free_running": fr.metrics.get("left_truth"),
        },
        "differs_before_departure": [
            sid
            for sid, rec in fr.records.items()
            if not _alike_before_departure(tf.records[sid], rec)
        ],
    }


def _alike_before_departure(truth: Record, model: Record) -> bool:
    """Whether the free-running record's outputs up to and including its first departure
    (all of them, final answer included, when it never left the truth) are the
    teacher-forced record's, as fed back. Records without the facts are not checked."""
    if "left_truth_at" not in model:
        return True
    at = model["left_truth_at"]
    upto = len(model["turns"]) if at is None else at + 1
    pairs = zip(truth["turns"][:upto], model["turns"][:upto], strict=True)
    if any(fed_back(t["pred"]) != m["pred"] for t, m in pairs):
        return False
    return at is not None or fed_back(truth["final_pred"]) == model["final_pred"]


def format_history_pair(pair: HistoryPair, n: int) -> list[str]:
    """The text of the pair: what ``memeval compare`` prints after the comparison."""
    tf, fr = pair["m1"]["teacher_forced"], pair["m1"]["free_running"]
    lines = [
        "teacher-forced vs free-running, the same checkpoint on the same scenarios: the gap "
        "(free-running minus teacher-forced) is what feeding the model its own earlier turns "
        "costs",
        f"  m1: teacher-forced {score_text(tf['correct'], tf['total'], tf['rate'])}, "
        f"free-running {score_text(fr['correct'], fr['total'], fr['rate'])}; gap "
        f"{fmt_pp(pair['m1_gap_pp'])}, 95% CI {fmt_pp_ci(pair['m1_gap_ci95_pp'])} (paired, "
        f"Newcombe); exact McNemar {pair['m1_statement']}",
    ]
    if pair["m2_gap_pp"] is None:
        lines.append(f"  m2: {pair['m2_statement']}")
    else:
        lines.append(
            f"  m2: gap {fmt_pp(pair['m2_gap_pp'])} over the {pair['m2_scenarios']} aligned "
            f"scenarios ({pair['m2_turns']} turns), 95% CI {fmt_pp_ci(pair['m2_gap_ci95_pp'])} "
            f"(clustered by scenario); exact sign-flip permutation test: {pair['m2_statement']}"
        )
    for which in ("teacher_forced", "free_running"):
        left = pair["left_truth"][which]
        if left is not None:
            lines.append(
                f"  left the truth, {which.replace('_', '-')}: {left_truth_words(left, n)}"
            )
    for ids, words in (
        (pair["derailed"], "derailed (m1 right teacher-forced, wrong free-running)"),
        (pair["recovered"], "recovered (m1 wrong teacher-forced, right free-running)"),
        (pair["lost_turns"], "scenarios with fewer turns right free-running"),
        (pair["gained_turns"], "scenarios with more turns right free-running"),
    ):
        lines.append(f"  {words}: {len(ids)}" + (f": {shown_ids(ids)}" if ids else ""))
    if pair["differs_before_departure"]:
        ids = pair["differs_before_departure"]
        lines.append(
            f"  WARNING: {len(ids)} scenario(s) answer differently in the two runs where the "
            "free-running prompts were still the teacher-forced ones (up to the first turn "
            f"that left the truth): they were not decoded alike: {shown_ids(ids)}"
        )
    return lines
