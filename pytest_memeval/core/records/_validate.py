"""The checks of the per-scenario side of the results schema.

:func:`validate_record` (a line of ``predictions.jsonl`` or ``journal.jsonl``) and
:func:`validate_prediction` (a line of a predictions file to replay): each field present
with the type its TypedDict (:mod:`._types`) declares, read through
:func:`._fields.fields_of`, then the values' agreement with one another. Each returns
the object typed or raises :class:`._fields.RecordError` naming the place (file:line,
scenario), the field and what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from pytest_memeval.core.history import HISTORIES
from pytest_memeval.core.records._fields import Checker, fields_of, shown
from pytest_memeval.core.records._types import (
    GRANULARITIES,
    Overlong,
    Prediction,
    PredictionTurn,
    Record,
    Turn,
)
from pytest_memeval.core.tags import check_tags, meta_problem

__all__ = ["validate_prediction", "validate_record"]

#: Every field is checked, except ``id``: read first, so that errors can name the scenario.
_RECORD_REQUIRED = fields_of(Record, required=True, skip=("id",))
_RECORD_OPTIONAL = fields_of(Record, required=False)
_TURN_REQUIRED = fields_of(Turn, required=True)
_OVERLONG = fields_of(Overlong, required=True)


def _record_id(obj: Mapping[str, object], where: str) -> Checker:
    """Check ``id`` and return a checker whose place names the scenario."""
    check = Checker(where)
    if "id" not in obj:
        raise check.fail("id", "missing field 'id'")
    sid = obj["id"]
    if not isinstance(sid, str):
        raise check.fail("id", f"field 'id' must be a string, got {shown(sid)}")
    return Checker(f"{where}: scenario {sid!r}", sid)


def validate_record(obj: object, where: str) -> Record:
    """Check one scenario record (a line of ``predictions.jsonl`` or ``journal.jsonl``).

    ``where`` names the place, e.g. ``"runs/x/predictions.jsonl:12"``; errors add the
    scenario id once it is known. Checked: every field :func:`~.scoring.score` writes is
    present with its type (the runtime's context fields, ``notes`` and ``overlong`` only
    when present), and the values agree with one another: ``n_turns`` is the number of
    turns and each turn's ``index`` its position; a turn's ``match`` is null exactly when
    its ``gt`` is (an unscored turn); a parse failure never matches and has a reason;
    ``aligned`` agrees with ``n_memory_chain`` and the turns' ``granularity``.

    Returns ``obj`` itself, typed; raises :class:`RecordError`.
    """
    record = Checker(where).obj(obj, None)
    check = _record_id(record, where)
    check.fields(record, _RECORD_REQUIRED)
    check.fields(record, _RECORD_OPTIONAL, required=False)
    _check_optional_values(check, record)
    if record["parse_fail"] is True and record["final_match"] is True:
        raise check.fail(
            "final_match",
            "field 'final_match' is true but 'parse_fail' is true (a parse failure never matches)",
        )
    if (record["parse_fail_reason"] is None) == (record["parse_fail"] is True):
        state = "null" if record["parse_fail_reason"] is None else "given"
        raise check.fail(
            "parse_fail_reason",
            f"field 'parse_fail_reason' is {state} but 'parse_fail' is "
            f"{str(record['parse_fail']).lower()} (a reason is given exactly for a parse failure)",
        )
    turns = record["turns"]
    assert isinstance(turns, list)
    if record["n_turns"] != len(turns):
        raise check.fail(
            "n_turns",
            f"field 'n_turns' is {record['n_turns']}, but 'turns' has {len(turns)} entries",
        )
    chain = record["n_memory_chain"]
    aligned = chain is None or chain == record["n_turns"]
    if record["aligned"] is not aligned:
        raise check.fail(
            "aligned",
            f"field 'aligned' is {str(record['aligned']).lower()}, but 'n_memory_chain' is "
            f"{shown(chain)} and 'n_turns' {record['n_turns']} (aligned: no chain, or one "
            "entry per turn)",
        )
    for i, value in enumerate(turns):
        _check_turn(check, check.obj(value, f"turns[{i}]"), i, aligned=aligned)
    _check_history_facts(check, record, aligned=aligned)
    return cast(Record, record)


def _check_optional_values(check: Checker, record: dict[str, object]) -> None:
    """What the types leave open in the optional fields, where present: ``tags`` and
    ``meta`` within their limits (:mod:`.tags`), ``notes`` strings, ``overlong`` typed."""
    if "tags" in record:
        try:
            check_tags(record["tags"])
        except ValueError as exc:
            raise check.fail("tags", str(exc)) from None
    if "meta" in record and (problem := meta_problem(record["meta"])) is not None:
        raise check.fail("meta", problem)
    if "notes" in record:
        check.strings(record["notes"], "notes")
    if "overlong" in record:
        check.fields(
            check.obj(record["overlong"], "overlong"),
            _OVERLONG,
            prefix="overlong.",
        )


def _check_history_facts(check: Checker, record: dict[str, object], *, aligned: bool) -> None:
    """``history`` one of :data:`~.history.HISTORIES`; ``left_truth_at`` and
    ``still_right_after`` given together, in range, and ``still_right_after`` null exactly
    where there is nothing to count (never left the truth, or unaligned). Whether they agree
    with the turns is the recount's check (:mod:`.recount`)."""
    if "history" in record and record["history"] not in HISTORIES:
        raise check.fail(
            "history",
            f"field 'history' must be one of {', '.join(HISTORIES)}, got "
            f"{shown(record['history'])}",
        )
    given = [key for key in ("left_truth_at", "still_right_after") if key in record]
    if len(given) == 1:
        other = "still_right_after" if given[0] == "left_truth_at" else "left_truth_at"
        raise check.fail(other, f"missing field {other!r} (given with {given[0]!r})")
    if not given:
        return
    at, after, n = record["left_truth_at"], record["still_right_after"], record["n_turns"]
    assert isinstance(n, int)
    if at is not None and not 0 <= cast(int, at) < n:
        raise check.fail(
            "left_truth_at",
            f"field 'left_truth_at' is {at}, but the record has {n} turn(s) (a turn index, or "
            "null when the model never left the truth)",
        )
    if (after is None) != (at is None or not aligned):
        state = "null" if after is None else "given"
        raise check.fail(
            "still_right_after",
            f"field 'still_right_after' is {state}, but 'left_truth_at' is {shown(at)} and "
            f"'aligned' {str(aligned).lower()} (a count exactly where an aligned scenario "
            "left the truth)",
        )
    if after is not None and not 0 <= cast(int, after) <= n - cast(int, at) - 1:
        raise check.fail(
            "still_right_after",
            f"field 'still_right_after' is {after}, but only {n - cast(int, at) - 1} turn(s) "
            "follow 'left_truth_at'",
        )


def _check_turn(check: Checker, turn: dict[str, object], i: int, *, aligned: bool) -> None:
    p = f"turns[{i}]."
    check.fields(turn, _TURN_REQUIRED, prefix=p)
    if turn["index"] != i:
        raise check.fail(f"{p}index", f"field '{p}index' is {turn['index']}, expected {i}")
    if turn["granularity"] not in GRANULARITIES:
        raise check.fail(
            f"{p}granularity",
            f"field '{p}granularity' must be one of {', '.join(GRANULARITIES)}, got "
            f"{shown(turn['granularity'])}",
        )
    if (turn["granularity"] == "unaligned") == aligned:
        raise check.fail(
            f"{p}granularity",
            f"field '{p}granularity' is {shown(turn['granularity'])}, but 'aligned' is "
            f"{str(aligned).lower()}",
        )
    if (turn["match"] is None) != (turn["gt"] is None):
        state = "null" if turn["match"] is None else str(turn["match"]).lower()
        gt = "null" if turn["gt"] is None else "given"
        raise check.fail(
            f"{p}match",
            f"field '{p}match' is {state} but '{p}gt' is {gt} (a turn is scored exactly when "
            "it has a ground truth)",
        )
    if turn["parse_fail"] is True and turn["match"] is True:
        raise check.fail(
            f"{p}match",
            f"field '{p}match' is true but '{p}parse_fail' is true (a parse failure never matches)",
        )


def validate_prediction(obj: object, where: str) -> Prediction:
    """Check one line of a predictions file to replay; return it normalised.

    The replay input format (docs/results-schema.md, "Replay input"): ``id`` (str),
    ``final_pred`` (str), ``turns`` (a list of ``{"pred": str}``); the stop flags
    ``final_stopped`` and each turn's ``stopped`` are true, false or absent (missing or
    null) and given on every output of the line or on none; ``prompt_tail`` is kept when it
    is a string; other fields are ignored. Whether the line fits its scenario (the number of
    turns) and the file (ids once, stop flags on every line or none) is the replay's check.

    Raises :class:`RecordError` (``where`` is the file and line).
    """
    line = Checker(where).obj(obj, None, ' (a prediction line is {"id": ...})')
    check = _record_id(line, where)
    sid = cast(str, line["id"])
    if "final_pred" not in line:
        raise check.fail("final_pred", "missing field 'final_pred'")
    final = line["final_pred"]
    if not isinstance(final, str):
        raise check.fail("final_pred", f"field 'final_pred' must be a string, got {shown(final)}")
    if "turns" not in line:
        raise check.fail("turns", "missing field 'turns' (a list of {\"pred\": ...}, one per turn)")
    raw_turns = line["turns"]
    if not isinstance(raw_turns, list):
        raise check.fail("turns", f"field 'turns' must be a list, got {type(raw_turns).__name__}")
    turns: list[PredictionTurn] = []
    for i, raw in enumerate(raw_turns):
        if not isinstance(raw, dict):
            raise check.fail(f"turns[{i}]", f"field 'turns[{i}]' must be an object with 'pred'")
        if "pred" not in raw:
            raise check.fail(f"turns[{i}].pred", f"missing field 'turns[{i}].pred'")
        pred = raw["pred"]
        if not isinstance(pred, str):
            raise check.fail(
                f"turns[{i}].pred", f"field 'turns[{i}].pred' must be a string, got {shown(pred)}"
            )
        turns.append(
            {"pred": pred, "stopped": check.flag(raw.get("stopped"), f"turns[{i}].stopped")}
        )
    final_stopped = check.flag(line.get("final_stopped"), "final_stopped")
    names = [f"turns[{i}].stopped" for i in range(len(turns))] + ["final_stopped"]
    flags = [t["stopped"] for t in turns] + [final_stopped]
    given = [n for n, f in zip(names, flags, strict=True) if f is not None]
    if given and len(given) != len(names):
        lacking = next(n for n, f in zip(names, flags, strict=True) if f is None)
        raise check.fail(
            lacking,
            f"field {lacking!r} is missing while {given[0]!r} is given: a line carries the "
            "stop flags of all its outputs or of none",
        )
    tail = line.get("prompt_tail")
    return {
        "id": sid,
        "final_pred": final,
        "final_stopped": final_stopped,
        "turns": turns,
        "prompt_tail": tail if isinstance(tail, str) else "",
    }
