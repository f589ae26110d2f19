"""The checks of the run-level side of the results schema: ``metrics.json`` and a shard's scope.

:func:`validate_metrics` and :func:`validate_shard_scope`: each field present with the type
its TypedDict (:mod:`._metrics`) declares, read through
:func:`._fields.fields_of`, then the values the types cannot state (the schema
version, the fixed vocabularies, ``m1.total == n``). Each returns the document typed or
raises :class:`._fields.RecordError` naming the file, the field and what is wrong.
"""

from __future__ import annotations

from typing import cast

from pytest_memeval.core.history import HISTORIES
from pytest_memeval.core.records._fields import Checker, fields_of, is_kind, shown
from pytest_memeval.core.records._metrics import (
    STOP_FLAGS,
    CountFields,
    Fingerprints,
    LeftTruth,
    Metrics,
    ParseFailCounts,
    PositionCounts,
    RateBlock,
    ShardScope,
    SliceBlock,
)
from pytest_memeval.core.records._types import SCHEMA_VERSION
from pytest_memeval.core.tags import tag_problem

__all__ = ["validate_metrics", "validate_shard_scope"]

_PARSE_FAIL = fields_of(ParseFailCounts, required=True)
_FINGERPRINTS = fields_of(Fingerprints, required=False)
_RATE_REQUIRED = fields_of(RateBlock, required=True)
_RATE_OPTIONAL = fields_of(RateBlock, required=False)
#: The count fields are required even of a ``counts_only`` read; the other required fields
#: of ``metrics.json`` are not.
_COUNTS_REQUIRED = fields_of(CountFields, required=True)
_METRICS_REQUIRED = fields_of(Metrics, required=True, skip=CountFields.__required_keys__)
_METRICS_OPTIONAL = fields_of(Metrics, required=False)
_SLICE = fields_of(SliceBlock, required=True)
_LEFT_TRUTH = fields_of(LeftTruth, required=True)
_COUNT_PAIR = fields_of(PositionCounts, required=True)
_SHARD_SCOPE = fields_of(ShardScope, required=True)


def validate_metrics(obj: object, where: str, *, counts_only: bool = False) -> Metrics:
    """Check a ``metrics.json`` document of schema :data:`SCHEMA_VERSION`.

    ``where`` names the file. Checked: a JSON object, of this schema version when it says;
    the count fields (``n``, ``m1``, ``m2``, ``unaligned``, ``parse_fail``, with their
    inner fields) and ``schema_version``, ``ckpt``, ``kind``, ``complete``, ``scope``,
    ``missing``, ``not_selected`` present with their types; every other documented field
    typed where present, ``stop_flags`` one of ``present``, ``absent``, ``mixed``;
    ``missing``/``not_selected`` lists of ids; ``m1.total == n``. Whether the counts agree
    with the predictions is the recount's job (:func:`pytest_memeval.core.recount.recount_run`).

    ``counts_only``: require only the count fields (the recount's own reading, which
    checks nothing else of the document's presence); the other fields are still typed
    where present.

    Returns ``obj`` itself, typed; raises :class:`RecordError`.
    """
    check = Checker(where)
    doc = check.obj(obj, None, " (metrics.json is one object)")
    if "schema_version" in doc and doc["schema_version"] != SCHEMA_VERSION:
        raise check.fail(
            "schema_version",
            f"field 'schema_version' is {shown(doc['schema_version'])}; this version of "
            f"pytest-memeval reads schema {SCHEMA_VERSION} (docs/results-schema.md)",
        )
    check.fields(doc, _COUNTS_REQUIRED)
    check.fields(doc, _METRICS_REQUIRED, required=not counts_only)
    check.fields(doc, _METRICS_OPTIONAL, required=False)
    _check_blocks(check, doc)
    if "history" in doc and doc["history"] not in HISTORIES:
        raise check.fail(
            "history",
            f"field 'history' must be one of {', '.join(HISTORIES)}, got {shown(doc['history'])}",
        )
    if "left_truth" in doc:
        _check_left_truth(check, doc["left_truth"])
    if "stop_flags" in doc and doc["stop_flags"] not in STOP_FLAGS:
        raise check.fail(
            "stop_flags",
            f"field 'stop_flags' must be one of {', '.join(STOP_FLAGS)}, got "
            f"{shown(doc['stop_flags'])}",
        )
    m1 = cast("dict[str, object]", doc["m1"])
    if m1["total"] != doc["n"]:
        raise check.fail("m1.total", f"field 'm1.total' is {m1['total']}, but 'n' is {doc['n']}")
    return cast(Metrics, doc)


def _check_blocks(check: Checker, doc: dict[str, object]) -> None:
    """The inner fields of the typed blocks: ``m1``/``m2``, ``slices``, ``parse_fail`` and
    ``fingerprints``; ``missing``/``not_selected`` lists of strings."""
    for block in ("m1", "m2"):
        _check_rates(check, doc[block], block)
    if "slices" in doc:
        _check_slices(check, cast("dict[str, object]", doc["slices"]))
    check.fields(
        check.obj(doc["parse_fail"], "parse_fail"),
        _PARSE_FAIL,
        prefix="parse_fail.",
    )
    if "fingerprints" in doc:
        check.fields(
            cast("dict[str, object]", doc["fingerprints"]),
            _FINGERPRINTS,
            prefix="fingerprints.",
            required=False,
        )
    for ids in ("missing", "not_selected"):
        if ids in doc:
            check.strings(doc[ids], ids)


def _check_rates(check: Checker, value: object, name: str) -> None:
    """An ``m1``/``m2`` block: the counts and rate, the interval fields where present."""
    rates = check.obj(value, name)
    check.fields(rates, _RATE_REQUIRED, prefix=f"{name}.")
    check.fields(rates, _RATE_OPTIONAL, prefix=f"{name}.", required=False)


def _check_left_truth(check: Checker, value: object) -> None:
    """``left_truth``: ``at`` (turn index -> count), ``never`` and ``still_right``."""
    block = check.obj(value, "left_truth")
    check.fields(block, _LEFT_TRUTH, prefix="left_truth.")
    for key, count in cast("dict[str, object]", block["at"]).items():
        if not key.isdigit() or not is_kind(count, "int"):
            raise check.fail(
                "left_truth.at",
                f"field 'left_truth.at' maps turn indices to counts, got {shown(key)}: "
                f"{shown(count)}",
            )
    check.fields(
        check.obj(block["still_right"], "left_truth.still_right"),
        _COUNT_PAIR,
        prefix="left_truth.still_right.",
    )


def _check_slices(check: Checker, slices: dict[str, object]) -> None:
    """``slices``: a valid tag -> one :class:`SliceBlock` each, ``m1.total == n``."""
    for tag, value in slices.items():
        where = f"slices[{tag!r}]"
        if (problem := tag_problem(tag)) is not None:
            raise check.fail("slices", f"field 'slices': {problem}")
        block = check.obj(value, where)
        check.fields(block, _SLICE, prefix=f"{where}.")
        for rates in ("m1", "m2"):
            _check_rates(check, block[rates], f"{where}.{rates}")
        total = cast("dict[str, object]", block["m1"])["total"]
        if total != block["n"]:
            raise check.fail(
                f"{where}.m1.total",
                f"field '{where}.m1.total' is {total}, but '{where}.n' is {block['n']}",
            )


def validate_shard_scope(obj: object, where: str) -> ShardScope:
    """Check ``scope.shard`` of a shard run's metrics (``where`` names the file): every field
    of :class:`ShardScope` present with its type. Only ``memeval merge`` reads the block, so
    :func:`validate_metrics` leaves it alone. Returns ``obj`` typed; raises
    :class:`RecordError`."""
    check = Checker(where)
    shard = check.obj(obj, "scope.shard")
    check.fields(shard, _SHARD_SCOPE, prefix="scope.shard.")
    return cast(ShardScope, shard)
