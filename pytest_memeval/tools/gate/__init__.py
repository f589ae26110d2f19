"""The CI gate and known failures: a run held to thresholds, a baseline and its slices.

:mod:`.plugin` is the pytest plugin (the thresholds, ``--memeval-baseline``,
``--memeval-expect``; the gate decides the exit status), :mod:`.checks` the exact checks in
fractions, :mod:`.slices` the per-slice gates, :mod:`.known_failures` the failing items of a
run (and the ``memeval known-failures`` command). This package's names are imported from
here, never from its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.gate.checks import GateCheck
from pytest_memeval.tools.gate.known_failures import ExpectError, failed_items, load_known_failures
from pytest_memeval.tools.gate.plugin import (
    GATE_KEY,
    Baseline,
    GateOutcome,
    GateSettings,
    MemevalGate,
    evaluate_gate,
    parse_rate,
    resolution_warnings,
    wrong_answer,
)
from pytest_memeval.tools.gate.slices import (
    Outcome,
    SliceGates,
    evaluate_slice_gates,
    outcomes,
    slice_limits,
    slice_warnings,
    split_values,
)

__all__ = [
    "GATE_KEY",
    "Baseline",
    "ExpectError",
    "GateCheck",
    "GateOutcome",
    "GateSettings",
    "MemevalGate",
    "Outcome",
    "SliceGates",
    "evaluate_gate",
    "evaluate_slice_gates",
    "failed_items",
    "load_known_failures",
    "outcomes",
    "parse_rate",
    "resolution_warnings",
    "slice_limits",
    "slice_warnings",
    "split_values",
    "wrong_answer",
]
