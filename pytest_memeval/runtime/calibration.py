"""Which processes of a run measured the fast path's calibration and which reused a stored one.

Each process (an xdist worker, or the single process) reports how its fast decoder got its
calibration (:func:`calibration_report`: plain data, sent to the controller in the worker's
``workeroutput``); the controller's :class:`CalibrationTally` adds them up into
``metrics.json``'s ``timing.calibration`` and the summary line (:func:`describe_calibration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pytest_memeval.decode import Decoder
from pytest_memeval.decode.fast import FastDecoder

__all__ = [
    "OUTPUT_KEY",
    "CalibrationTally",
    "calibration_report",
    "describe_calibration",
]

#: Where a worker puts its report for the controller (``config.workeroutput``).
OUTPUT_KEY = "memeval_calibration"


def calibration_report(decoder: Decoder | None) -> dict[str, Any] | None:
    """How ``decoder`` got its calibration: ``{source, seconds, entry}`` (``source``
    ``measured`` or ``reused``, ``entry`` the stored file or ``None``), or ``None`` when it
    used no store (another decoder, a fixed margin, nothing decoded)."""
    if not isinstance(decoder, FastDecoder) or decoder.calibration_outcome is None:
        return None
    outcome = decoder.calibration_outcome
    return {
        "source": outcome.source,
        "seconds": round(outcome.seconds, 3),
        "entry": None if outcome.entry is None else str(outcome.entry),
    }


class CalibrationTally:
    """The controller's count of the processes that measured or reused a calibration."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def add(self, report: object) -> None:
        if isinstance(report, Mapping) and report.get("source") in ("measured", "reused"):
            self.reports.append(dict(report))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        output = getattr(node, "workeroutput", None)
        if isinstance(output, dict):
            self.add(output.get(OUTPUT_KEY))

    def timing(self) -> dict[str, object]:
        """``{"calibration": {measured, reused, measure_s, entries}}``, or ``{}`` when no
        process reported one (docs/results-schema.md)."""
        if not self.reports:
            return {}
        measured = [r for r in self.reports if r["source"] == "measured"]
        entries = sorted({str(r["entry"]) for r in self.reports if r.get("entry")})
        return {
            "calibration": {
                "measured": len(measured),
                "reused": len(self.reports) - len(measured),
                "measure_s": round(sum(float(r.get("seconds") or 0.0) for r in measured), 3),
                "entries": entries,
            }
        }


def describe_calibration(block: object) -> str | None:
    """The summary line for ``timing.calibration`` (``None`` without one)."""
    if not isinstance(block, Mapping):
        return None
    measured, reused = int(block.get("measured", 0)), int(block.get("reused", 0))
    entries = block.get("entries") or []
    where = f"; stored in {entries[0]}" if len(entries) == 1 else ""
    if measured and not reused:
        how = f"measured ({float(block.get('measure_s', 0.0)):.1f} s)"
    elif reused and not measured:
        how = "reused (measured by an earlier run)"
    else:
        how = (
            f"measured by {measured} process{'es' if measured > 1 else ''} "
            f"({float(block.get('measure_s', 0.0)):.1f} s), reused by {reused}"
        )
    if measured and not entries:
        where = "; not stored (see the warnings)"
    return f"calibration: {how}{where}"
