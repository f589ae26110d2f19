"""Build run directories, replayable predictions and benchmarks by hand, for tests.

Run directories (for compare, gate, report, merge) and the predictions a ``replay`` profile
scores without a model (so a test runs the whole plugin on many scenarios in seconds).

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
from pytest_memeval.core.rundir import sha256_file
from pytest_memeval.core.scoring import departure
from pytest_memeval.core.sharding import shard_scope, shard_slice

from .conftest import MemevalProject, demo_records, write_jsonl

#: Record fields that say where and how fast a scenario ran, not what it produced: they
#: differ between equal runs (serial or xdist, resumed, sharded and merged).
PLACEMENT = ("worker", "device", "decode_s", "decode_batch", "decode_batch_size")
#: The counts of ``metrics.json`` that equal runs of the same scenarios share.
COUNT_FIELDS = ("n", "m1", "m2", "unaligned", "parse_fail", "m2_by_position", "generated_turns")


def content(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` without their :data:`PLACEMENT` fields: what equal runs must share."""
    return [{k: v for k, v in r.items() if k not in PLACEMENT} for r in records]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (``predictions.jsonl``, a journal), blank lines skipped."""
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def conv(*turns: str, final: str = "fridge", query: str = "where is mug ?") -> list[dict[str, str]]:
    """Benchmark messages: a system line, one user/assistant pair per turn in ``turns``, then
    the final ``query`` answered ``final``."""
    messages = [{"role": "system", "content": "objects : mug counter"}]
    for t in turns:
        messages += [{"role": "user", "content": "next"}, {"role": "assistant", "content": t}]
    return messages + [{"role": "user", "content": query}, {"role": "assistant", "content": final}]


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


def with_history(record: dict[str, Any], history: str) -> dict[str, Any]:
    """``record`` as a run of ``history`` writes it: ``history``, ``left_truth_at`` and
    ``still_right_after`` (computed from its turns as ``scoring.score`` does)."""
    at, after = departure(record["turns"], aligned=record["aligned"])
    return {**record, "history": history, "left_truth_at": at, "still_right_after": after}


def write_run(
    run_dir: Path,
    records: Sequence[dict[str, Any]],
    *,
    ckpt: str,
    benchmark: str = "sha256:bench",
    missing: Sequence[str] = (),
    history: str | None = None,
    fingerprints: dict[str, Any] | None = None,
) -> Path:
    """Write ``predictions.jsonl`` and a consistent ``metrics.json`` under ``run_dir``
    (``history``: the metrics' ``history`` field; absent by default, as in older runs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tally = Tally().extend(records)
    counts: dict[str, Any] = dict(tally.counts())
    counts.pop("histories")  # checked by the recount, no field of metrics.json
    (run_dir / "predictions.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8"
    )
    metrics = {
        "schema_version": METRICS_SCHEMA_VERSION,
        "ckpt": ckpt,
        "kind": "replay",
        "complete": not missing,
        **counts,
        **({"history": history} if history is not None else {}),
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
        "fingerprints": fingerprints
        or {"benchmark": benchmark, "model": None, "adapter": None, "decoding": None},
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


#: The final answer of a prediction replayed wrong: no location of the demo benchmark.
WRONG_FINAL = "nowhere_at_all"


def benchmark_with_ids(ids: Sequence[str]) -> list[dict[str, Any]]:
    """Demo oracle records renamed to ``ids`` (repeated past the demo's 189 scenarios)."""
    pool = demo_records("oracle", len(ids))
    return [{**pool[i % len(pool)], "id": sid} for i, sid in enumerate(ids)]


def replay_prediction(
    record: dict[str, Any],
    *,
    right: bool = True,
    final: str | None = None,
    wrong_turn: bool = False,
) -> dict[str, Any]:
    """A replayable prediction for benchmark ``record``: its turns and final answer are the
    training targets (the assistant messages), except the final answer when not ``right``
    (:data:`WRONG_FINAL`, or ``final`` whenever given) and the first turn when ``wrong_turn``.
    Outcomes are then known without a model."""
    answers = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    turns = [{"pred": a, "stopped": True} for a in answers[:-1]]
    if wrong_turn:
        turns[0]["pred"] = "look around the room"
    if final is None:
        final = answers[-1] if right else WRONG_FINAL
    return {
        "id": record["id"],
        "turns": turns,
        "final_pred": final,
        "final_stopped": True,
        "prompt_tail": "<|user|>" + record["messages"][-2]["content"] + "<|assistant|>",
    }


def replay_source(
    scenarios: Sequence[dict[str, Any]],
    *,
    wrong_final: Sequence[str] = (),
    wrong_turn: Sequence[str] = (),
    final_text: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """:func:`replay_prediction` for each of ``scenarios``: the final answers of the ids in
    ``wrong_final`` wrong (or ``final_text[id]``), the first turn of ``wrong_turn`` wrong."""
    final_text = final_text or {}
    return [
        replay_prediction(
            rec,
            right=rec["id"] not in wrong_final,
            final=final_text.get(rec["id"]),
            wrong_turn=rec["id"] in wrong_turn,
        )
        for rec in scenarios
    ]


CRAFTED_PROFILE = """
[tool.memeval.ckpt.crafted]
kind = "replay"
predictions = "crafted.jsonl"
benchmark = "bench.jsonl"
"""


def write_crafted(
    project: MemevalProject,
    records: Sequence[dict[str, Any]],
    *,
    cache: bool = False,
    **replayed: Any,
) -> Path:
    """A model-free project: ``records`` as the benchmark, the ``crafted`` replay profile
    scoring :func:`replay_source` ``(records, **replayed)``. ``cache=True`` keeps pytest's
    cache plugin on (``--lf`` needs it). Returns the predictions file."""
    project.write(records, profiles=CRAFTED_PROFILE)
    if cache:
        toml = project.path / "pyproject.toml"
        toml.write_text(toml.read_text("utf-8").replace("-p no:cacheprovider ", ""), "utf-8")
    return write_jsonl(project.path / "crafted.jsonl", replay_source(records, **replayed))


# -- shard runs built by hand (records in scoring's format, counted with the plugin's Tally) --

#: The fingerprints every hand-built shard carries unless a test gives others.
FINGERPRINTS = {
    "benchmark": "sha256:bench",
    "model": "sha256:model",
    "adapter": "sha256:adapter",
    "decoding": "sha256:decoding",
}


def write_shard(
    run_dir: Path,
    all_ids: list[str],
    k: int,
    n: int,
    *,
    fingerprints: dict[str, str] = FINGERPRINTS,
    overlong: tuple[str, ...] = (),
    overrides: dict[str, Any] | None = None,
    history: str = "truth",
) -> Path:
    """A finished shard run of ``k``/``n`` as the controller writes it (scenarios in
    ``overlong`` evaluated past the model's context, as --memeval-allow-overlong flags them;
    ``history`` the prompts' history, which its records and metrics say)."""
    start = all_ids.index(shard_slice(all_ids, k, n)[0])
    records = [
        make_record(
            sid, start + i, final_match=(start + i) % 3 != 0, turn_matches=[True, i % 2 == 0]
        )
        for i, sid in enumerate(shard_slice(all_ids, k, n))
    ]
    records = [with_history(record, history) for record in records]
    for record in records:
        if record["id"] in overlong:
            record["overlong"] = {"tokens": 900, "limit": 512}
    run_dir.mkdir(parents=True)
    predictions = run_dir / "predictions.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    tally = Tally().extend(records)
    counts: dict[str, Any] = dict(tally.counts())
    counts.pop("histories")  # checked by the recount, no field of metrics.json
    metrics = {
        "schema_version": METRICS_SCHEMA_VERSION,
        "ckpt": "demo",
        "kind": "model",
        "complete": False,
        **counts,
        "history": history,
        "scope": {
            "benchmark_total": len(all_ids),
            "in_scope": len(records),
            "selected": len(records),
            "evaluated": len(records),
            "subset": False,
            "shard": shard_scope(all_ids, (k, n)),
            "resumed": 0,
        },
        "missing": [],
        "not_selected": [],
        "m2_by_position": {
            str(p): {"correct": v[0], "total": v[1]} for p, v in sorted(tally.by_position.items())
        },
        "generated_turns": tally.generated_turns,
        "fingerprints": dict(fingerprints),
        "decoding": {"max_new_tokens": 16, "path": "fast"},
        "benchmark": {"source": "bench.jsonl"},
        "predictions_sha256": sha256_file(predictions),
        "timing": {"wall_s": 2.0 + k, "scenarios_per_s": 1.0},
        "overrides": overrides or {},
    }
    (run_dir / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    return run_dir


#: A 7-scenario benchmark's ids: shards 1/3 .. 3/3 hold 3, 2 and 2 of them.
SHARD_IDS = [f"s{i:02d}" for i in range(7)]
