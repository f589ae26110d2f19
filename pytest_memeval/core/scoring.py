"""Scoring: scenario + rollout -> the per-scenario record (one line of ``predictions.jsonl``).

The record is plain JSON data: it travels from the worker to the controller on the test
report and is the only thing the aggregate, the recount, compare and the reports read.
Record fields are documented in ``docs/results-schema.md``.
"""

from __future__ import annotations

from typing import Any, cast

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.history import fed_back
from pytest_memeval.core.matching import ParseRules, match_output
from pytest_memeval.core.records import Record, Rollout, Turn

__all__ = ["departure", "score"]


def departure(turns: list[Turn], *, aligned: bool) -> tuple[int | None, int | None]:
    """``(left_truth_at, still_right_after)`` of a record's turns.

    ``left_truth_at``: the first turn whose prediction, as it would be fed back
    (:func:`~pytest_memeval.core.history.fed_back`), is not the true assistant message
    (``target``) byte for byte: from there on a free-running prompt differs from the
    teacher-forced one. ``None`` when the model reproduced every turn. ``still_right_after``:
    how many of the turns after it were still right (``match`` true); ``None`` when it never
    left the truth or the scenario is unaligned (its turns are not scored).
    """
    for i, turn in enumerate(turns):
        if fed_back(turn["pred"]) != turn["target"]:
            if not aligned:
                return i, None
            return i, sum(1 for later in turns[i + 1 :] if later["match"] is True)
    return None, None


def score(scenario: Scenario, rollout: Rollout, rules: ParseRules, **context: Any) -> Record:
    """Build the record of ``scenario`` (:class:`~pytest_memeval.core.records.Record`).

    m1 is structure-independent: the final answer is scored whether or not the turn structure
    aligns with ``memory_chain``. Turns of an unaligned scenario are predicted and recorded
    (``gt`` and ``match`` null, granularity ``unaligned``) but never scored for m2.
    ``context`` adds the runtime's fields of the record (``worker``, ``device``,
    ``decode_s``, ``decode_batch``, ``decode_batch_size``).
    """
    n_assistant = len(scenario.assistant_indices)
    if len(rollout.outputs) != n_assistant:
        raise ValueError(
            f"scenario {scenario.id}: decoder returned {len(rollout.outputs)} outputs for "
            f"{n_assistant} assistant messages"
        )
    granularity = scenario.granularity
    turns: list[Turn] = []
    for t, (k, out) in enumerate(zip(scenario.turn_indices, rollout.outputs[:-1], strict=False)):
        gt = scenario.turn_gt(t)
        result = match_output(out.text, gt, stopped=out.stopped, kind="turn", rules=rules)
        turns.append(
            {
                "index": t,
                "message_index": k,
                "pred": out.text,
                "gt": gt,
                "target": scenario.messages[k]["content"],
                "match": result.match if gt is not None else None,
                "parse_fail": result.parse_fail,
                "stopped": out.stopped,
                "granularity": granularity,
                "generated": out.generated,
            }
        )
    final = rollout.outputs[-1]
    final_result = match_output(
        final.text, scenario.final_gt, stopped=final.stopped, kind="final", rules=rules
    )
    record: Record = {
        "id": scenario.id,
        "index": scenario.index,
        "final_pred": final.text,
        "final_gt": scenario.final_gt,
        "final_match": final_result.match,
        "parse_fail": final_result.parse_fail,
        "parse_fail_reason": final_result.reason,
        "final_stopped": final.stopped,
        "aligned": scenario.aligned,
        "n_turns": len(scenario.turn_indices),
        "n_memory_chain": None if scenario.memory_chain is None else len(scenario.memory_chain),
        "turns": turns,
        "decode": rollout.path,
        "prompt_tail": rollout.prompt_tail,
    }
    # What the prompts held, and where the model first left the truth (docs/results-schema.md).
    record["history"] = rollout.history
    record["left_truth_at"], record["still_right_after"] = departure(
        turns, aligned=scenario.aligned
    )
    # The benchmark's evaluation metadata rides along: the slices are counted from the records.
    if scenario.tags:
        record["tags"] = list(scenario.tags)
    if scenario.meta is not None:
        record["meta"] = dict(scenario.meta)
    if rollout.notes:
        record["notes"] = list(rollout.notes)
    # The context's keys are chosen by the caller, so mypy cannot check them against
    # Record; the validator does wherever the record is read back (records.validate_record).
    cast("dict[str, Any]", record).update(context)
    return record
