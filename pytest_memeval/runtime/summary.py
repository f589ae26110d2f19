"""The terminal lines of a finished run: the memeval section's numbers.

``format_summary`` gives the lines every run shows (counts, intervals, parse failures,
throughput, calibration); ``free_running_lines`` what a free-running run adds. Read by the
controller's terminal summary and by ``memeval merge``'s tests; pure functions of
``metrics.json``.
"""

from __future__ import annotations

from pathlib import Path

from pytest_memeval.core.formatting import columns, per_second, score_text
from pytest_memeval.core.free_running import (
    left_truth_words,
    position_table,
    teacher_forced_beside,
)
from pytest_memeval.core.history import HISTORY_TRUTH, describe_history, history_of
from pytest_memeval.core.records import Metrics, RateBlock
from pytest_memeval.core.stats import interval_words
from pytest_memeval.runtime.calibration import describe_calibration

__all__ = ["format_summary", "free_running_lines"]


def _pct(block: RateBlock) -> str:
    return score_text(block["correct"], block["total"], block["rate"])


def _status(m: Metrics) -> str:
    shard = (m.get("scope") or {}).get("shard")
    if m["complete"]:
        return "complete"
    if isinstance(shard, dict) and shard and not m["missing"] and not m["not_selected"]:
        return f"shard {shard['spec']} complete; merge all shards with memeval merge"
    return "INCOMPLETE"


def _with_ci(line: str, block: RateBlock) -> list[str]:
    # The interval under the rate, with its method and sample (m2: turns in scenarios).
    words = interval_words(block)
    return [line, " " * 16 + words] if words else [line]


def free_running_lines(run_dir: Path, m: Metrics) -> list[str]:
    """What a free-running run's summary adds: where its scenarios left the truth, and m2 by
    turn position beside the teacher-forced run of the checkpoint when there is one."""
    beside = teacher_forced_beside(run_dir, m)
    lines = []
    if "left_truth" in m:
        lines.append(left_truth_words(m["left_truth"], m["n"]))
    lines.append(beside.note)
    lines.append(
        "m2 by turn position (aligned scenarios) and where the model first left the truth:"
    )
    lines += ["  " + line for line in columns(position_table(m, beside))]
    return lines


def format_summary(m: Metrics) -> str:
    """The terminal lines for a metrics dict."""
    lines = [
        f"ckpt {m['ckpt']}: {m['n']} scenarios ({_status(m)})",
        *(
            [f"history: {describe_history(history_of(m))}"]
            if history_of(m) != HISTORY_TRUTH
            else []
        ),
        *_with_ci(f"m1 final-query: {_pct(m['m1'])}", m["m1"]),
        *_with_ci(f"m2 turn-level:  {_pct(m['m2'])}  (aligned scenarios only)", m["m2"]),
        f"unaligned: {m['unaligned']}/{m['n']}   parse failures: final {m['parse_fail']['final']}, "
        f"turns {m['parse_fail']['turns']}",
    ]
    if m.get("stop_flags", "present") != "present":
        lines.append(
            f"stop flags: {m['stop_flags']} in the replayed predictions: cut-off outputs "
            "could not be detected (parse failures count only empty or off-pattern outputs)"
        )
    if m.get("overlong"):
        lines.append(
            f"overlong: {m['overlong']}/{m['n']} scenarios were evaluated past the model's "
            "context (--memeval-allow-overlong): not comparable to a normal result"
        )
    timing = m.get("timing") or {}
    per_s = timing.get("scenarios_per_s")
    if isinstance(per_s, (int, float)):
        batch = (
            f", mean batch {timing['mean_batch']:.1f} of {timing['batch_size']}"
            if timing.get("mean_batch") is not None
            else ""
        )
        lines.append(
            f"throughput: {per_second(per_s)} "
            f"over {timing['wall_s']:.1f} s (decode {m['decoding'].get('path')}{batch})"
        )
    calibration = describe_calibration(timing.get("calibration"))
    if calibration:
        lines.append(calibration)
    return "\n".join(lines)
