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

This package's ``__init__`` is its public face (every name is imported from here); the code
sits in private modules, one concern each:

* ``_types.py``: the per-scenario types (decoder outputs, record, replay line);
* ``_metrics.py``: the run-level types (``metrics.json`` and its blocks, a shard's scope);
* ``_fields.py``: the field checks derived from a TypedDict (:class:`RecordError`);
* ``_validate.py``: :func:`validate_record`, :func:`validate_prediction`;
* ``_validate_metrics.py``: :func:`validate_metrics`, :func:`validate_shard_scope`;
* ``_reader.py``: :func:`read_records`, a file of records line by line.

None carries behaviour beyond the checks or imports anything heavy, so every stage
(scoring in ``core``, the decoders, the runtime, the tools) can share them.
"""

from __future__ import annotations

from pytest_memeval.core.records._fields import RecordError
from pytest_memeval.core.records._metrics import (
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
from pytest_memeval.core.records._reader import read_records
from pytest_memeval.core.records._types import (
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
from pytest_memeval.core.records._validate import validate_prediction, validate_record
from pytest_memeval.core.records._validate_metrics import validate_metrics, validate_shard_scope

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
