"""The run-level side of the results schema: the ``metrics.json`` document and its blocks.

:class:`Metrics` with its blocks (:class:`RateBlock`, :class:`SliceBlock`,
:class:`LeftTruth`, ...), :class:`Counts` (the fields the aggregate and the recount both
compute), and :class:`ShardScope` (``scope.shard`` of a shard run). Plain types only; the
checks derived from them are in :mod:`._validate_metrics`. Import them from
:mod:`pytest_memeval.core.records`.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "STOP_FLAGS",
    "CountFields",
    "Counts",
    "Fingerprints",
    "LeftTruth",
    "Metrics",
    "ParseFailCounts",
    "PositionCounts",
    "RateBlock",
    "ShardScope",
    "SliceBlock",
]

#: ``stop_flags`` of metrics.json (see :func:`pytest_memeval.core.metrics.stop_flags_kind`).
STOP_FLAGS = ("present", "absent", "mixed")


class _RateCounts(TypedDict):
    correct: int
    total: int
    rate: float | None


class RateBlock(_RateCounts, total=False):
    """``m1`` / ``m2``: the counts, the rate (null when nothing was scored) and, in runs
    written since intervals exist, the 95% interval (``clusters``: m2 only)."""

    ci95: list[float] | None
    ci95_method: str | None
    clusters: int


class SliceBlock(TypedDict):
    """One entry of ``slices`` in metrics.json: the scenarios that carry one tag.

    ``m1`` and ``m2`` as the run's own blocks (Wilson interval; interval clustered by
    scenario, over the slice's aligned scenarios); ``m1_mde_pp`` the smallest m1 difference
    ``n`` paired scenarios can detect at best (80% power, alpha 0.05; null below 6)."""

    n: int
    m1: RateBlock
    m2: RateBlock
    unaligned: int
    m1_mde_pp: float | None


class ParseFailCounts(TypedDict):
    """``parse_fail`` of metrics.json: unparseable final answers and turns."""

    final: int
    turns: int


class PositionCounts(TypedDict):
    """One entry of ``m2_by_position``."""

    correct: int
    total: int


class LeftTruth(TypedDict):
    """``left_truth`` of metrics.json: where the scenarios first left the truth.

    ``at``: turn index -> scenarios whose first turn that is not the true message is that
    one (``left_truth_at``); ``never``: scenarios that reproduced every turn; ``still_right``:
    over the aligned scenarios that left it, the turns after that first departure and how
    many of them were right (``still_right_after``). Counted over the records that carry
    the facts (every record of a run written since they exist)."""

    at: dict[str, int]
    never: int
    still_right: PositionCounts


class Fingerprints(TypedDict, total=False):
    """``fingerprints`` of metrics.json (``sha256:`` hashes; null where there is nothing)."""

    benchmark: str | None
    model: str | None
    adapter: str | None
    decoding: str | None
    #: only when the profile names a ``tokenizer`` directory
    tokenizer: str | None


class CountFields(TypedDict):
    """The count fields every ``metrics.json`` has: required even of a ``counts_only``
    read (:func:`~._validate_metrics.validate_metrics`)."""

    n: int
    m1: RateBlock
    m2: RateBlock
    unaligned: int
    parse_fail: ParseFailCounts


class Counts(CountFields, total=False):
    """The count fields of ``metrics.json``: what the aggregate
    (:meth:`pytest_memeval.core.metrics.Tally.counts`) and the recount
    (:func:`pytest_memeval.core.recount.recount_file`) compute and must agree on.
    ``stop_flags``, ``overlong``, ``slices`` and ``left_truth`` came later: older metrics
    lack them. ``histories`` (records per history) is no field of metrics.json: it is
    checked against the one ``history`` the metrics claim."""

    stop_flags: str
    overlong: int
    slices: dict[str, SliceBlock]
    left_truth: LeftTruth
    histories: dict[str, int]


class _MetricsFields(CountFields):
    schema_version: int
    ckpt: str
    kind: str
    complete: bool
    scope: dict[str, object]
    missing: list[str]
    not_selected: list[str]


class ShardScope(TypedDict):
    """``scope.shard`` of a shard run's ``metrics.json``: which slice of the benchmark it
    covers (written by :func:`pytest_memeval.core.sharding.shard_scope`; ``null`` in any
    other run). ``start``/``stop`` are 0-based positions, ``stop`` exclusive; ``first`` and
    ``last`` are ``null`` for an empty shard."""

    spec: str
    index: int
    count: int
    start: int
    stop: int
    size: int
    first: str | None
    last: str | None
    benchmark_total: int


class Metrics(_MetricsFields, total=False):
    """``metrics.json`` (docs/results-schema.md). The required fields are those
    :func:`validate_metrics` requires; the others came later (readers default
    ``stop_flags`` to ``present`` and ``overlong`` to 0), are not in every hand-made run,
    or belong to some writers only (``overrides``, ``merged_from``)."""

    stop_flags: str
    overlong: int
    slices: dict[str, SliceBlock]
    history: str
    left_truth: LeftTruth
    m2_by_position: dict[str, PositionCounts]
    generated_turns: int
    fingerprints: Fingerprints
    decoding: dict[str, object]
    benchmark: dict[str, object] | None
    predictions_sha256: str
    timing: dict[str, object]
    created: str
    overrides: dict[str, object]
    merged_from: list[dict[str, object]]
