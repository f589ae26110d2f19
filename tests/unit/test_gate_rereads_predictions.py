"""After the run is written, the gate re-reads this session's predictions for the paired
resolution check: a damaged record is a bug and raises; an unreadable file is a warning."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_memeval.core.records import Metrics, RecordError
from pytest_memeval.core.rundir import PREDICTIONS
from pytest_memeval.tools.gate import Baseline, GateSettings, MemevalGate

METRICS = cast(
    Metrics,
    {"complete": True, "m1": {"correct": 9, "total": 10}, "m2": {"correct": 5, "total": 10}},
)


def _gate(pytester: pytest.Pytester) -> MemevalGate:
    base = Baseline(Path("runs/ref"), m1=(9, 10), m2=(5, 10), m1_outcomes={"a": True})
    return MemevalGate(pytester.parseconfig(), GateSettings(baseline=base, max_drop=Fraction(1)))


def test_missing_predictions_are_a_warning_not_silence(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    gate = _gate(pytester)
    gate.pytest_memeval_run_written(tmp_path, METRICS)
    assert gate.wrote_run
    said = [w for w in gate.outcome.warnings if "could not re-read" in w]
    assert len(said) == 1 and str(tmp_path / PREDICTIONS) in said[0]
    assert "FileNotFoundError" in said[0]


def test_a_damaged_record_raises(pytester: pytest.Pytester, tmp_path: Path) -> None:
    record: dict[str, Any] = {"id": "a"}  # JSON, but not a record: a bug if written by us
    (tmp_path / PREDICTIONS).write_text(json.dumps(record) + "\n", "utf-8")
    gate = _gate(pytester)
    with pytest.raises(RecordError, match=r"predictions.jsonl:1: scenario 'a': missing field"):
        gate.pytest_memeval_run_written(tmp_path, METRICS)
