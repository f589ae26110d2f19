"""Aggregation: per-scenario records -> counts, streamed one record at a time.

The controller feeds records as they arrive; nothing here keeps the records themselves, so a
5,000-scenario run aggregates in constant memory. :mod:`pytest_memeval.core.recount` recomputes
the same counts from ``predictions.jsonl`` with separate code, and the two must agree.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from pytest_memeval.core.history import HISTORY_TRUTH, history_of
from pytest_memeval.core.records import (
    SCHEMA_VERSION,
    Counts,
    Fingerprints,
    LeftTruth,
    Metrics,
    RateBlock,
    Record,
    SliceBlock,
)
from pytest_memeval.core.stats import (
    ClusterSums,
    clustered_rate_with_ci,
    min_detectable_drop,
    rate_with_ci,
)
from pytest_memeval.core.tags import slice_order

__all__ = [
    "METRICS_SCHEMA_VERSION",
    "SliceTally",
    "Tally",
    "metrics_document",
    "rate_block",
    "stop_flags_kind",
]

#: Version of ``metrics.json``: the one results-schema version,
#: :data:`pytest_memeval.core.records.SCHEMA_VERSION` (this name is kept for its importers).
METRICS_SCHEMA_VERSION = SCHEMA_VERSION


def rate_block(correct: int, total: int) -> RateBlock:
    """``{"correct", "total", "rate"}``; rate is null when nothing was scored."""
    return {"correct": correct, "total": total, "rate": (correct / total) if total else None}


def stop_flags_kind(without: int, n: int) -> str:
    """``stop_flags`` of metrics.json: ``present`` (every record says whether each output
    ended by itself; every model run), ``absent`` (none does: replayed predictions of another
    harness, so cut-off outputs could not be detected), ``mixed`` (a merge of both)."""
    if without == 0:
        return "present"
    return "absent" if without == n else "mixed"


def _with_interval(block: RateBlock, interval: RateBlock) -> RateBlock:
    """``block`` with the interval fields of ``interval`` (stats' result) that it has."""
    if "ci95" in interval:
        block["ci95"] = interval["ci95"]
    if "ci95_method" in interval:
        block["ci95_method"] = interval["ci95_method"]
    if "clusters" in interval:
        block["clusters"] = interval["clusters"]
    return block


@dataclass
class SliceTally:
    """Running counts of one slice (the records that carry one tag): constant memory."""

    n: int = 0
    m1_correct: int = 0
    unaligned: int = 0
    m2_correct: int = 0
    m2_clusters: ClusterSums = field(default_factory=ClusterSums)

    def block(self) -> SliceBlock:
        """The slice's entry of ``slices`` in metrics.json (docs/results-schema.md)."""
        mde = min_detectable_drop(self.n)
        return {
            "n": self.n,
            "m1": _with_interval(
                rate_block(self.m1_correct, self.n), rate_with_ci(self.m1_correct, self.n)
            ),
            "m2": _with_interval(
                rate_block(self.m2_correct, self.m2_clusters.n),
                clustered_rate_with_ci(self.m2_correct, self.m2_clusters),
            ),
            "unaligned": self.unaligned,
            "m1_mde_pp": None if mde is None else mde * 100,
        }


@dataclass
class Tally:
    """Running counts over scenario records."""

    n: int = 0
    m1_correct: int = 0
    m2_correct: int = 0
    m2_total: int = 0
    unaligned: int = 0
    parse_fail_final: int = 0
    parse_fail_turns: int = 0
    generated_turns: int = 0
    no_stop_flags: int = 0  # records replayed from predictions without stop flags
    overlong: int = 0  # evaluated past the model's context (--memeval-allow-overlong)
    by_position: dict[int, list[int]] = field(default_factory=dict)
    #: m2's turns clustered by scenario (for its interval): integer sums, constant memory.
    m2_clusters: ClusterSums = field(default_factory=ClusterSums)
    #: per tag (at most MAX_DISTINCT_TAGS of them): the slices of metrics.json
    slices: dict[str, SliceTally] = field(default_factory=dict)
    #: records per history (one history, unless something mixed them)
    histories: dict[str, int] = field(default_factory=dict)
    #: ``left_truth`` of metrics.json: first departures by turn, scenarios that never left
    #: the truth, and the turns after a departure (right, total) of aligned scenarios
    left_at: dict[int, int] = field(default_factory=dict)
    never_left: int = 0
    after_departure: list[int] = field(default_factory=lambda: [0, 0])

    def add(self, record: Record) -> None:
        self.n += 1
        self.m1_correct += bool(record["final_match"])
        self.parse_fail_final += bool(record["parse_fail"])
        self.no_stop_flags += record.get("final_stopped") is None
        self.overlong += record.get("overlong") is not None
        if not record["aligned"]:
            self.unaligned += 1
        scored = right = 0
        for turn in record["turns"]:
            self.parse_fail_turns += bool(turn["parse_fail"])
            self.generated_turns += bool(turn.get("generated", True))
            if record["aligned"] and turn["match"] is not None:
                scored += 1
                right += bool(turn["match"])
                slot = self.by_position.setdefault(int(turn["index"]), [0, 0])
                slot[0] += bool(turn["match"])
                slot[1] += 1
        self.m2_total += scored
        self.m2_correct += right
        history = history_of(record)
        self.histories[history] = self.histories.get(history, 0) + 1
        self._add_departure(record)
        if scored:
            self.m2_clusters = self.m2_clusters.add(right, scored)
        for tag in record.get("tags", ()):
            part = self.slices.setdefault(tag, SliceTally())
            part.n += 1
            part.m1_correct += bool(record["final_match"])
            part.unaligned += not record["aligned"]
            if scored:
                part.m2_correct += right
                part.m2_clusters = part.m2_clusters.add(right, scored)

    def _add_departure(self, record: Record) -> None:
        """The record's ``left_truth_at`` / ``still_right_after`` (older records lack them)."""
        if "left_truth_at" not in record:
            return
        at = record["left_truth_at"]
        if at is None:
            self.never_left += 1
            return
        self.left_at[at] = self.left_at.get(at, 0) + 1
        after = record.get("still_right_after")
        if after is not None:
            self.after_departure[0] += after
            self.after_departure[1] += record["n_turns"] - at - 1

    def left_truth(self) -> LeftTruth:
        """``left_truth`` of metrics.json (docs/results-schema.md)."""
        return {
            "at": {str(k): v for k, v in sorted(self.left_at.items())},
            "never": self.never_left,
            "still_right": {
                "correct": self.after_departure[0],
                "total": self.after_departure[1],
            },
        }

    def extend(self, records: Iterable[Record]) -> Tally:
        for record in records:
            self.add(record)
        return self

    def counts(self) -> Counts:
        """The count fields of ``metrics.json`` (those the recount must reproduce).

        m1 carries its 95% Wilson interval; m2 its interval clustered by scenario (the turns
        of one scenario share a scene and a history: they are not independent), with the
        number of clusters. ``ci95_method`` names the method (docs/statistics.md). ``slices``:
        the same per tag, in the order slices are shown (``{}`` when no record has tags).
        """
        m1 = rate_with_ci(self.m1_correct, self.n)
        return {
            "n": self.n,
            "m1": _with_interval(rate_block(self.m1_correct, self.n), m1),
            "m2": _with_interval(
                rate_block(self.m2_correct, self.m2_total),
                clustered_rate_with_ci(self.m2_correct, self.m2_clusters),
            ),
            "unaligned": self.unaligned,
            "parse_fail": {"final": self.parse_fail_final, "turns": self.parse_fail_turns},
            "stop_flags": stop_flags_kind(self.no_stop_flags, self.n),
            "overlong": self.overlong,
            "slices": {tag: self.slices[tag].block() for tag in slice_order(self.slices)},
            "left_truth": self.left_truth(),
            "histories": dict(sorted(self.histories.items())),
        }


def metrics_document(
    tally: Tally,
    *,
    ckpt: str,
    kind: str,
    complete: bool,
    scope: Mapping[str, object],
    missing: list[str],
    not_selected: list[str],
    fingerprints: Mapping[str, str | None] | Fingerprints,
    decoding: Mapping[str, object],
    benchmark: dict[str, object] | None,
    predictions_sha256: str,
    timing: Mapping[str, object],
    merged_from: Sequence[Mapping[str, object]] | None = None,
    overrides: Mapping[str, object] | None = None,
    history: str = HISTORY_TRUTH,
) -> Metrics:
    """The ``metrics.json`` of a run (docs/results-schema.md), from its tally and context.

    One builder for every writer (the controller, ``memeval merge``), so the layout cannot
    drift between a run and a merged run. ``merged_from`` (a merge's shards) and
    ``overrides`` are written only when given, last, in that order.
    """
    counts = tally.counts()
    metrics: Metrics = {
        "schema_version": METRICS_SCHEMA_VERSION,
        "ckpt": ckpt,
        "kind": kind,
        "complete": complete,
        # tally.counts(), field by field so that the checker sees each one
        "n": counts["n"],
        "m1": counts["m1"],
        "m2": counts["m2"],
        "unaligned": counts["unaligned"],
        "parse_fail": counts["parse_fail"],
        "stop_flags": counts["stop_flags"],
        "overlong": counts["overlong"],
        "slices": counts["slices"],
        # The run's history (the records say the same: the recount checks it).
        "history": history,
        "left_truth": counts["left_truth"],
        "scope": dict(scope),
        "missing": missing,
        "not_selected": not_selected,
        "m2_by_position": {
            str(k): {"correct": v[0], "total": v[1]} for k, v in sorted(tally.by_position.items())
        },
        "generated_turns": tally.generated_turns,
        # The session's fingerprints (runtime/session.py: benchmark, model, adapter,
        # decoding), kept there as a plain str -> str | None table.
        "fingerprints": cast(Fingerprints, dict(fingerprints)),
        "decoding": dict(decoding),
        "benchmark": benchmark,
        "predictions_sha256": predictions_sha256,
        "timing": dict(timing),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if merged_from is not None:
        metrics["merged_from"] = [dict(shard) for shard in merged_from]
    if overrides is not None:
        metrics["overrides"] = dict(overrides)
    return metrics
