"""Plain-data records that flow between the stages, and the one check of their schema.

* decoder outputs: :class:`TurnOutput`, :class:`Rollout`;
* the per-scenario record (one line of ``predictions.jsonl``, built by
  :func:`pytest_memeval.core.scoring.score`): :class:`Record` with its :class:`Turn` entries;
* the metrics document (``metrics.json``): :class:`Metrics` with its blocks;
* a line of a predictions file to replay (``kind = "replay"``): :class:`Prediction`.

Every field is documented in ``docs/results-schema.md`` (version :data:`SCHEMA_VERSION`).
JSON read from disk is checked once, here, by :func:`validate_record`,
:func:`validate_metrics` and :func:`validate_prediction`, whose field checks are derived from
the TypedDicts (the schema is stated once): each raises :class:`RecordError`
naming the place (file:line, scenario), the field and what is wrong, or returns the object
typed, so readers index it without further ``isinstance`` checks and a reader's ``KeyError``
or ``TypeError`` is a bug, never bad input.

This is the public module; the code sits in private ones, one concern each:

* ``_record_types.py``: the per-scenario types (decoder outputs, record, replay line);
* ``_metrics_types.py``: the run-level types (``metrics.json`` and its blocks, a shard's scope);
* ``_field_checks.py``: the field checks derived from a TypedDict (:class:`RecordError`);
* ``_record_checks.py``: :func:`validate_record`, :func:`validate_prediction`;
* ``_metrics_checks.py``: :func:`validate_metrics`, :func:`validate_shard_scope`;
* ``_record_reader.py``: :func:`read_records`, a file of records line by line.

None carries behaviour beyond the checks or imports anything heavy, so every stage
(scoring in ``core``, the decoders, the runtime, the tools) can share them.
"""

from __future__ import annotations

from pytest_memeval.core._field_checks import RecordError
from pytest_memeval.core._metrics_checks import validate_metrics, validate_shard_scope
from pytest_memeval.core._metrics_types import (
    STOP_FLAGS,
    Counts,
    Fingerprints,
    LeftTruth,
    Metrics,
    ParseFailCounts,
    PositionCounts,
    RateBlock,
    ShardScope,
    SliceBlock,
)
from pytest_memeval.core._record_checks import validate_prediction, validate_record
from pytest_memeval.core._record_reader import read_records
from pytest_memeval.core._record_types import (
    GRANULARITIES,
    SCHEMA_VERSION,
    Overlong,
    Prediction,
    PredictionTurn,
    Record,
    Rollout,
    Turn,
    TurnOutput,
)

__all__ = [
    "GRANULARITIES",
    "SCHEMA_VERSION",
    "STOP_FLAGS",
    "Counts",
    "Fingerprints",
    "LeftTruth",
    "Metrics",
    "Overlong",
    "ParseFailCounts",
    "PositionCounts",
    "Prediction",
    "PredictionTurn",
    "RateBlock",
    "Record",
    "RecordError",
    "Rollout",
    "ShardScope",
    "SliceBlock",
    "Turn",
    "TurnOutput",
    "read_records",
    "validate_metrics",
    "validate_prediction",
    "validate_record",
    "validate_shard_scope",
]
