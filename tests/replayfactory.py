"""Model-free runs for end-to-end tests: demo records under chosen ids, replayable predictions.

The ``replay`` profile kind scores stored outputs without a model, so a test can run the whole
plugin (collection, xdist, controller, run directory) on many scenarios in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .conftest import demo_records


def benchmark_with_ids(ids: Sequence[str]) -> list[dict[str, Any]]:
    """Demo oracle records renamed to ``ids`` (repeated past the demo's 189 scenarios)."""
    pool = demo_records("oracle", len(ids))
    return [{**pool[i % len(pool)], "id": sid} for i, sid in enumerate(ids)]


def replay_prediction(record: dict[str, Any], *, right: bool) -> dict[str, Any]:
    """A replayable prediction: turns are the assistant messages, the final right or not."""
    assistant = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    final = assistant[-1] if right else "nowhere_at_all"
    return {
        "id": record["id"],
        "final_pred": final,
        "final_stopped": True,
        "turns": [{"pred": p, "stopped": True} for p in assistant[:-1]],
    }
