"""Build run directories by hand for the compare, gate and report tests.

The records follow ``scoring.score``'s format and ``metrics.json`` is counted with the
plugin's own :class:`~pytest_memeval.core.metrics.Tally`, so the runs pass ``recount_run`` exactly
like runs the controller writes; the tests then state the expected numbers themselves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_memeval.core.metrics import METRICS_SCHEMA_VERSION, Tally


def make_record(
    sid: str,
    index: int,
    *,
    final_match: bool,
    targets: Sequence[str] = ("pick mug from counter", "place mug in sink"),
    chain: Sequence[str] | None = None,
    turn_matches: Sequence[bool] | None = None,
    final_pred: str | None = None,
    final_gt: str = "sink",
    turn_preds: Sequence[str] | None = None,
    parse_fail: bool = False,
) -> dict[str, Any]:
    """One scenario record. ``chain`` defaults to ``targets`` (aligned); a chain of another
    length makes the scenario unaligned (turns recorded, not scored)."""
    chain = list(targets) if chain is None else list(chain)
    aligned = len(chain) == len(targets)
    matches = list(turn_matches) if turn_matches is not None else [True] * len(targets)
    preds = (
        list(turn_preds)
        if turn_preds is not None
        else [t if ok else "look around" for t, ok in zip(targets, matches, strict=False)]
    )
    turns = []
    for i, target in enumerate(targets):
        gt = chain[i] if aligned else None
        turns.append(
            {
                "index": i,
                "message_index": 2 + 2 * i,
                "pred": preds[i],
                "gt": gt,
                "target": target,
                "match": matches[i] if aligned else None,
                "parse_fail": False,
                "stopped": True,
                "granularity": "memory_chain" if aligned else "unaligned",
                "generated": True,
            }
        )
    if final_pred is None:
        final_pred = final_gt if final_match else "counter"
    return {
        "id": sid,
        "index": index,
        "final_pred": final_pred,
        "final_gt": final_gt,
        "final_match": final_match,
        "parse_fail": parse_fail,
        "parse_fail_reason": "empty" if parse_fail else None,
        "final_stopped": True,
        "aligned": aligned,
        "n_turns": len(targets),
        "n_memory_chain": len(chain),
        "turns": turns,
        "decode": "replay",
        "prompt_tail": f"<|user|>where is the mug? ({sid})<|assistant|>",
        "worker": "master",
        "device": "cpu",
    }


def write_run(
    run_dir: Path,
    records: Sequence[dict[str, Any]],
    *,
    ckpt: str,
    benchmark: str = "sha256:bench",
    missing: Sequence[str] = (),
) -> Path:
    """Write ``predictions.jsonl`` and a consistent ``metrics.json`` under ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tally = Tally().extend(records)
    (run_dir / "predictions.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8"
    )
    metrics = {
        "schema_version": METRICS_SCHEMA_VERSION,
        "ckpt": ckpt,
        "kind": "replay",
        "complete": not missing,
        **tally.counts(),
        "scope": {
            "benchmark_total": len(records) + len(missing),
            "in_scope": len(records) + len(missing),
            "selected": len(records) + len(missing),
            "evaluated": len(records),
            "subset": False,
            "shard": None,
        },
        "missing": list(missing),
        "not_selected": [],
        "m2_by_position": {
            str(k): {"correct": v[0], "total": v[1]} for k, v in sorted(tally.by_position.items())
        },
        "fingerprints": {"benchmark": benchmark, "model": None, "adapter": None, "decoding": None},
        "decoding": {"path": "replay"},
    }
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2), "utf-8")
    return run_dir


# The seed's comparison, rebuilt: 189 scenarios; baseline 167 right, oracle 169 right
# (4 fixed, 2 broken); the oracle's door-grounded data changes the turns of 165 scenarios.
SEED_N = 189
SEED_FIXED = ("s0003", "s0010", "s0050", "s0100")
SEED_BROKEN = ("s0020", "s0150")
# The seed's table as issue 14 quotes it: the same 167/189 vs 169/189, but 6 fixed and 4
# broken (exact McNemar p = 0.7539).
SEED_TABLE_FIXED = ("s0003", "s0010", "s0050", "s0100", "s0120", "s0160")
SEED_TABLE_BROKEN = ("s0020", "s0070", "s0150", "s0170")


def seed_runs(
    tmp: Path, fixed: Sequence[str] = SEED_FIXED, broken: Sequence[str] = SEED_BROKEN
) -> tuple[Path, Path]:
    """Write the seed's baseline and oracle runs under ``tmp``; return their directories.

    Baseline 167/189 right, oracle 169/189: ``fixed`` and ``broken`` (``len(fixed) ==
    len(broken) + 2``) are the scenarios whose m1 outcome flips."""
    assert len(fixed) == len(broken) + 2
    ids = [f"s{i:04d}" for i in range(1, SEED_N + 1)]
    # 22 - len(fixed) scenarios both runs get wrong: baseline wrong = those + fixed = 22
    # (167 right), oracle wrong = those + broken = 20 (169 right).
    both_wrong = set(ids[-(22 - len(fixed)) :])
    base_wrong = both_wrong | set(fixed)
    oracle_wrong = both_wrong | set(broken)
    chain = ["pick mug from counter", "place mug in cabinet_left", "pick apple from table"]
    grounded = [
        "pick mug from counter",
        "open cabinet_left",
        "place mug in cabinet_left",
        "pick apple from table",
    ]
    baseline, oracle = [], []
    for i, sid in enumerate(ids):
        baseline.append(make_record(sid, i, final_match=sid not in base_wrong, targets=chain))
        divergent = i < 165
        oracle.append(
            make_record(
                sid,
                i,
                final_match=sid not in oracle_wrong,
                targets=grounded if divergent else chain,
                chain=chain,
            )
        )
    a = write_run(tmp / "baseline", baseline, ckpt="baseline", benchmark="sha256:baseline-b1")
    b = write_run(tmp / "oracle", oracle, ckpt="oracle", benchmark="sha256:oracle-b1")
    return a, b


def replay_source(
    scenarios: Sequence[dict[str, Any]],
    *,
    wrong_final: Sequence[str] = (),
    wrong_turn: Sequence[str] = (),
    final_text: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Predictions for the replay decoder over benchmark ``scenarios``: every turn and final
    answer right (the training targets), except the final answers of ``wrong_final``
    (predicted ``"nowhere"``, or ``final_text[id]``) and the first turn of ``wrong_turn``.
    Outcomes are then known without a model."""
    final_text = final_text or {}
    out = []
    for rec in scenarios:
        answers = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
        turns = [{"pred": a, "stopped": True} for a in answers[:-1]]
        if rec["id"] in wrong_turn:
            turns[0]["pred"] = "look around the room"
        final = final_text.get(rec["id"], "nowhere" if rec["id"] in wrong_final else answers[-1])
        out.append(
            {
                "id": rec["id"],
                "turns": turns,
                "final_pred": final,
                "final_stopped": True,
                "prompt_tail": "<|user|>" + rec["messages"][-2]["content"] + "<|assistant|>",
            }
        )
    return out


CRAFTED_PROFILE = """
[tool.memeval.ckpt.crafted]
kind = "replay"
predictions = "crafted.jsonl"
benchmark = "bench.jsonl"
"""
