"""Independent recount: the metrics again, from ``predictions.jsonl`` alone.

The seed's check ("accuracy recounted from predictions.jsonl equals the harness's metrics")
as code. This module deliberately shares no counting code with :mod:`pytest_memeval.core.metrics`:
it re-derives every match from the stored booleans with plain loops, so a bug in the
aggregate cannot hide behind the same bug in its check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from pytest_memeval.core.records import (
    Counts,
    Metrics,
    RateBlock,
    Record,
    RecordError,
    SliceBlock,
    read_records,
    validate_metrics,
)
from pytest_memeval.core.rundir import sha256_file
from pytest_memeval.core.stats import (
    ClusterSums,
    clustered_rate_with_ci,
    min_detectable_drop,
    rate_with_ci,
)
from pytest_memeval.core.tags import slice_order

__all__ = ["RecountError", "compare_counts", "recount_file", "recount_run"]

_CHECKED = ("n", "m1", "m2", "unaligned", "parse_fail")
#: Interval fields of the m1/m2 blocks: checked where metrics.json has them (runs written
#: before they existed lack them and still pass).
_INTERVAL_KEYS = ("ci95", "ci95_method", "clusters")


class RecountError(RuntimeError):
    """``metrics.json`` disagrees with ``predictions.jsonl``, or either is unreadable."""


def _records(path: Path) -> Iterator[Record]:
    """The checked records of ``path`` (:func:`.records.read_records`), or RecountError."""
    try:
        yield from read_records(path)
    except RecordError as exc:
        raise RecountError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise RecountError(f"{path}: not UTF-8 text ({exc.reason})") from None


def recount_file(path: Path) -> Counts:
    """Recount the count fields of ``metrics.json`` from a predictions file (``slices``
    included: each tag's scenarios recounted on their own).

    Every record is checked first (:func:`.records.validate_record`, ids once): a bad line
    is a :class:`RecountError` naming file, line, scenario and field.
    """
    return _recount(_records(path))[0]


def _recount(records: Iterable[Record]) -> tuple[Counts, dict[str, dict[str, int]]]:
    """The count fields and ``m2_by_position``, in one pass over checked records."""
    positions: dict[str, dict[str, int]] = {}
    n = final_ok = turn_ok = turn_scored = unaligned = pf_final = pf_turns = 0
    with_flags = without_flags = overlong = 0
    per_scenario: list[tuple[int, int]] = []  # (right, scored) of each aligned scenario
    histories: dict[str, int] = {}
    # left_truth, from the turns themselves: first departure -> scenarios; never; after
    left_at: dict[int, int] = {}
    never_left = after_right = after_total = 0
    # Per tag (a slice), one _Outcome per record that carries it: recounted below.
    by_tag: dict[str, list[_Outcome]] = {}
    for rec in records:
        n += 1
        if rec["final_match"] is True:
            final_ok += 1
        if rec["parse_fail"] is True:
            pf_final += 1
        if isinstance(rec["final_stopped"], bool):
            with_flags += 1
        else:
            without_flags += 1
        if rec["aligned"] is not True:
            unaligned += 1
        if rec.get("overlong") is not None:
            overlong += 1
        here_scored = here_ok = 0
        for turn in rec["turns"]:
            if turn["parse_fail"] is True:
                pf_turns += 1
            if rec["aligned"] is True and turn["match"] is not None:
                here_scored += 1
                slot = positions.setdefault(str(turn["index"]), {"correct": 0, "total": 0})
                slot["total"] += 1
                if turn["match"] is True:
                    here_ok += 1
                    slot["correct"] += 1
        turn_scored += here_scored
        turn_ok += here_ok
        history = rec.get("history", "truth")
        histories[history] = histories.get(history, 0) + 1
        if "left_truth_at" in rec:
            at, after = _departure(rec)
            if at is None:
                never_left += 1
            else:
                left_at[at] = left_at.get(at, 0) + 1
                if after is not None:
                    after_right += after
                    after_total += rec["n_turns"] - at - 1
        per_scenario.append((here_ok, here_scored))
        outcome = _Outcome(rec["final_match"] is True, rec["aligned"] is True, here_ok, here_scored)
        for tag in rec.get("tags", []):
            by_tag.setdefault(tag, []).append(outcome)
    m1, m2 = _rate_blocks(final_ok, n, turn_ok, ClusterSums.of(per_scenario))
    assert m2["total"] == turn_scored  # the sums count the same turns
    counts: Counts = {
        "n": n,
        "m1": m1,
        "m2": m2,
        "unaligned": unaligned,
        "parse_fail": {"final": pf_final, "turns": pf_turns},
        "stop_flags": _stop_flags(with_flags, without_flags),
        "overlong": overlong,
        "slices": {tag: _recount_slice(by_tag[tag]) for tag in slice_order(by_tag)},
        "left_truth": {
            "at": {str(at): left_at[at] for at in sorted(left_at)},
            "never": never_left,
            "still_right": {"correct": after_right, "total": after_total},
        },
    }
    counts["histories"] = dict(sorted(histories.items()))
    return counts, dict(sorted(positions.items(), key=lambda kv: int(kv[0])))


def _departure(rec: Record) -> tuple[int | None, int | None]:
    """The record's ``left_truth_at`` and ``still_right_after`` recomputed from its turns
    (a prediction stripped of surrounding whitespace against the true message, byte for
    byte; right turns after it, aligned scenarios only); a :class:`RecountError` naming the
    scenario when the record says otherwise."""
    at: int | None = None
    after: int | None = None
    for i, turn in enumerate(rec["turns"]):
        if turn["pred"].strip() != turn["target"]:
            at = i
            if rec["aligned"] is True:
                after = 0
                for later in rec["turns"][i + 1 :]:
                    if later["match"] is True:
                        after += 1
            break
    stored = (rec["left_truth_at"], rec.get("still_right_after"))
    if stored != (at, after):
        raise RecountError(
            f"scenario {rec['id']!r}: the record says left_truth_at {stored[0]}, "
            f"still_right_after {stored[1]}; its turns give {at}, {after}"
        )
    return at, after


def _rate_blocks(
    final_ok: int, n: int, turn_ok: int, sums: ClusterSums
) -> tuple[RateBlock, RateBlock]:
    """The m1 and m2 blocks, written out field by field from the recounted numbers (the
    interval formulas are stats.py's; the counts and their order are this module's)."""
    m1_ci = rate_with_ci(final_ok, n)
    m2_ci = clustered_rate_with_ci(turn_ok, sums)
    m1: RateBlock = {
        "correct": final_ok,
        "total": n,
        "rate": final_ok / n if n else None,
        "ci95": m1_ci["ci95"],
        "ci95_method": m1_ci["ci95_method"],
    }
    m2: RateBlock = {
        "correct": turn_ok,
        "total": sums.n,
        "rate": turn_ok / sums.n if sums.n else None,
        "ci95": m2_ci["ci95"],
        "ci95_method": m2_ci["ci95_method"],
        "clusters": m2_ci["clusters"],
    }
    return m1, m2


class _Outcome(NamedTuple):
    """What a slice's recount needs of one record (not the record: constant size)."""

    final_ok: bool
    aligned: bool
    turns_ok: int
    turns_scored: int


def _recount_slice(outcomes: list[_Outcome]) -> SliceBlock:
    """One slice's block, from the outcomes of the records that carry its tag."""
    n = len(outcomes)
    final_ok = sum(1 for o in outcomes if o.final_ok)
    unaligned = sum(1 for o in outcomes if not o.aligned)
    clusters = [(o.turns_ok, o.turns_scored) for o in outcomes if o.aligned]
    turn_ok = sum(right for right, _ in clusters)
    m1, m2 = _rate_blocks(final_ok, n, turn_ok, ClusterSums.of(clusters))
    mde = min_detectable_drop(n)
    return {
        "n": n,
        "m1": m1,
        "m2": m2,
        "unaligned": unaligned,
        "m1_mde_pp": None if mde is None else mde * 100,
    }


def _stop_flags(with_flags: int, without_flags: int) -> str:
    """``present``, ``absent`` or ``mixed``: records with and without ``final_stopped``."""
    if not without_flags:
        return "present"
    return "mixed" if with_flags else "absent"


def compare_counts(claimed: Mapping[str, object], recounted: Counts) -> list[str]:
    """Human-readable differences between claimed and recounted count fields."""
    problems = []
    theirs_all: Mapping[str, object] = recounted
    for key in _CHECKED:
        mine, theirs = claimed.get(key), theirs_all.get(key)
        if key in ("m1", "m2") and isinstance(mine, dict) and isinstance(theirs, dict):
            # The intervals are checked where claimed; the counts always.
            theirs = {k: v for k, v in theirs.items() if k not in _INTERVAL_KEYS or k in mine}
        if mine != theirs:
            problems.append(f"{key}: metrics say {mine!r}, recount gives {theirs!r}")
    # Metrics written before the field existed come from runs that always had stop flags.
    flags = claimed.get("stop_flags", "present")
    if flags != recounted.get("stop_flags"):
        problems.append(
            f"stop_flags: metrics say {flags!r}, recount gives {recounted.get('stop_flags')!r}"
        )
    # Metrics written before the field existed: no run could evaluate over-long scenarios.
    if claimed.get("overlong", 0) != recounted.get("overlong"):
        problems.append(
            f"overlong: metrics say {claimed.get('overlong', 0)!r}, "
            f"recount gives {recounted.get('overlong')!r}"
        )
    # Metrics written before slices existed lack the block: nothing claimed, nothing checked.
    if "slices" in claimed:
        problems += _slice_problems(claimed["slices"], recounted.get("slices", {}))
    # Likewise left_truth (free-running runs came later); history reads "truth" when absent.
    if "left_truth" in claimed and claimed["left_truth"] != recounted.get("left_truth"):
        problems.append(
            f"left_truth: metrics say {claimed['left_truth']!r}, "
            f"recount gives {recounted.get('left_truth')!r}"
        )
    problems += _history_problems(claimed, recounted)
    return problems


def _history_problems(claimed: Mapping[str, object], recounted: Counts) -> list[str]:
    """The records' history against the one the metrics claim (no records: nothing to check).

    A predictions file that mixes teacher-forced and free-running records is one run's
    numbers over two different questions: refused, saying how many of each."""
    theirs = recounted.get("histories") or {}
    mine = claimed.get("history", "truth")
    if not theirs or list(theirs) == [mine]:
        return []
    if len(theirs) > 1:
        shown = ", ".join(f"{n} with history {h}" for h, n in theirs.items())
        return [
            f"history: the records mix teacher-forced (truth) and free-running (model) "
            f"prompts ({shown}); a run holds one history"
        ]
    return [f"history: metrics say {mine!r}, the records say {next(iter(theirs))!r}"]


def _slice_problems(claimed: object, recounted: Mapping[str, SliceBlock]) -> list[str]:
    """Differences between the claimed and the recounted ``slices``, one line per tag."""
    if not isinstance(claimed, dict):
        return [f"slices: metrics say {claimed!r}, not an object"]
    problems = []
    for tag in slice_order([*claimed, *recounted]):
        mine, theirs = claimed.get(tag), recounted.get(tag)
        if mine is None:
            problems.append(f"slices: {tag!r} is missing (recount: {theirs!r})")
        elif theirs is None:
            problems.append(f"slices: {tag!r} is claimed, but no record carries that tag")
        elif mine != theirs:
            problems.append(f"slices[{tag!r}]: metrics say {mine!r}, recount gives {theirs!r}")
    if list(claimed) != list(recounted) and not problems:
        problems.append("slices: the tags are not in the order slices are shown")
    return problems


def _check_claims(
    claimed: Metrics, recounted: Counts, positions: dict[str, dict[str, int]], path: Path
) -> list[str]:
    """What else metrics.json claims that readers (compare, report, gate) rely on."""
    problems = []
    sha = claimed.get("predictions_sha256")
    if sha is not None and sha != sha256_file(path):
        problems.append(
            f"predictions_sha256: {path.name} is not the file these metrics were written for "
            "(edited after the run?)"
        )
    if "m2_by_position" in claimed and claimed["m2_by_position"] != positions:
        problems.append("m2_by_position: does not match the recount of the turns")
    if claimed.get("complete") is True:
        scope = claimed.get("scope") or {}
        if claimed.get("missing") or claimed.get("not_selected"):
            problems.append("complete: true, but scenarios are listed as missing or not selected")
        if scope.get("shard"):
            problems.append("complete: true for a shard run")
        if scope and scope.get("in_scope") != recounted["n"]:
            problems.append(
                f"complete: true, but {recounted['n']} records for {scope.get('in_scope')} "
                "scenarios in scope"
            )
    return problems


def recount_run(
    run_dir: Path,
    *,
    claimed: Metrics | None = None,
    records: Iterable[Record] | None = None,
) -> Counts:
    """Check ``run_dir/metrics.json`` against ``run_dir/predictions.jsonl``; raise on mismatch.

    Both files are checked against the schema first (:func:`.records.validate_metrics` with
    ``counts_only``, :func:`.records.validate_record` for each line): a malformed file is a
    :class:`RecountError` naming the file (and line, scenario) and the field. An unreadable
    file raises ``OSError``.

    A caller that has already read and checked both files (``load_checked_run``) passes the
    metrics as ``claimed`` and the records, in file order, as ``records``: the files are then
    not parsed a second time (the predictions file is still hashed for ``predictions_sha256``).
    """
    metrics_path, predictions_path = run_dir / "metrics.json", run_dir / "predictions.jsonl"
    for p in (metrics_path, predictions_path):
        if not p.is_file():
            raise RecountError(f"{p}: missing")
    if claimed is None:
        claimed = _read_claimed(metrics_path)
    recounted, positions = _recount(_records(predictions_path) if records is None else records)
    problems = compare_counts(claimed, recounted)
    problems += _check_claims(claimed, recounted, positions, predictions_path)
    if problems:
        raise RecountError(
            f"{run_dir}: recount disagrees with metrics.json: " + "; ".join(problems)
        )
    return recounted


def _read_claimed(metrics_path: Path) -> Metrics:
    """``metrics.json``'s count fields, checked (RecountError if malformed)."""
    try:
        return validate_metrics(
            json.loads(metrics_path.read_text(encoding="utf-8")),
            str(metrics_path),
            counts_only=True,
        )
    except json.JSONDecodeError as exc:
        raise RecountError(f"{metrics_path}: malformed ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise RecountError(f"{metrics_path}: not UTF-8 text ({exc.reason})") from None
    except RecordError as exc:
        raise RecountError(str(exc)) from None
