"""The CI gate and known failures: a run held to thresholds, a baseline and its slices.

:mod:`.plugin` is the pytest plugin (the thresholds, ``--memeval-baseline``,
``--memeval-expect``; the gate decides the exit status), :mod:`.checks` the exact checks in
fractions, :mod:`.slices` the per-slice gates, :mod:`.episodes` the gate of a closed-loop run
(``--memeval-min-success``), :mod:`.outcome` the verdict and exit status both gates share,
:mod:`.known_failures` the failing items of a run (and the ``memeval known-failures``
command). This package's names are imported from
here, never from its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.gate.checks import GateCheck, parse_rate
from pytest_memeval.tools.gate.episodes import (
    EpisodeBaseline,
    EpisodeGate,
    EpisodeGateSettings,
    episode_gate_settings,
    evaluate_episode_gate,
)
from pytest_memeval.tools.gate.known_failures import ExpectError, failed_items, load_known_failures
from pytest_memeval.tools.gate.outcome import GATE_KEY, GateOutcome, GateReporter
from pytest_memeval.tools.gate.plugin import (
    Baseline,
    GateSettings,
    MemevalGate,
    evaluate_gate,
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
    "EpisodeBaseline",
    "EpisodeGate",
    "EpisodeGateSettings",
    "ExpectError",
    "GateCheck",
    "GateOutcome",
    "GateReporter",
    "GateSettings",
    "MemevalGate",
    "Outcome",
    "SliceGates",
    "episode_gate_settings",
    "evaluate_episode_gate",
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
