"""The replay decoder: re-score an earlier run's ``predictions.jsonl`` without a model.

The seed's score-only mode: after merging shards, or after a change of the matching rule,
the stored raw outputs are scored again against the (current) benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..benchmark import BenchmarkError, Scenario
from ..profiles import Profile
from ..rundir import METRICS, read_predictions
from ._types import Rollout, TurnOutput

__all__ = ["ReplayDecoder", "source_fingerprints"]


def source_fingerprints(profile: Profile) -> dict[str, str | None]:
    """Model, adapter and decoding fingerprints of the run being replayed (if it has metrics)."""
    assert profile.predictions is not None
    metrics_path = profile.predictions.parent / METRICS
    fps: dict[str, Any] = {}
    if metrics_path.is_file():
        try:
            fps = json.loads(metrics_path.read_text(encoding="utf-8")).get("fingerprints", {})
        except (OSError, ValueError, AttributeError) as exc:
            raise BenchmarkError(
                f"{metrics_path}: unreadable metrics of the replayed run ({exc})"
            ) from None
    return {k: fps.get(k) for k in ("model", "adapter", "decoding")}


class ReplayDecoder:
    """Serves each scenario's stored outputs as its rollout."""

    path = "replay"

    def __init__(self, profile: Profile) -> None:
        assert profile.predictions is not None
        self.source: Path = profile.predictions
        self._records: dict[str, dict[str, Any]] = {}
        try:
            for record in read_predictions(self.source):
                self._records[record["id"]] = record
        except (OSError, ValueError) as exc:
            raise BenchmarkError(f"replay source {self.source}: {exc}") from None

    def rollout(self, scenario: Scenario) -> Rollout:
        record = self._records.get(scenario.id)
        if record is None:
            raise BenchmarkError(f"{self.source}: no prediction for scenario {scenario.id!r}")
        turns = record["turns"]
        if len(turns) != len(scenario.turn_indices):
            raise BenchmarkError(
                f"{self.source}: scenario {scenario.id!r} has {len(turns)} predicted turns but "
                f"the benchmark has {len(scenario.turn_indices)}"
            )
        # A missing stop flag is an error, not "stopped": assuming it would turn a cut-off
        # output (a parse failure) into a scored answer.
        try:
            outputs = [TurnOutput(t["pred"], bool(t["stopped"]), generated=False) for t in turns]
            outputs.append(
                TurnOutput(record["final_pred"], bool(record["final_stopped"]), generated=False)
            )
        except KeyError as exc:
            raise BenchmarkError(
                f"{self.source}: scenario {scenario.id!r} lacks field {exc.args[0]!r}"
            ) from None
        return Rollout(tuple(outputs), self.path, record.get("prompt_tail", ""))

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """Everything is in memory already."""
