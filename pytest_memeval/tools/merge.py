"""``memeval merge SHARD_DIR... -o OUT``: the N shard runs of ``--memeval-shard K/N`` -> one run.

The seed's "loud abort", as a command: shards are merged only if every one of them is a
finished shard run that passes the recount, together they are shards 1..N of the same N,
cover every scenario of the benchmark exactly once, and agree on the checkpoint, on every
fingerprint (benchmark, model, adapter, decoding) and on the history (teacher-forced or
free-running). Otherwise the command lists every problem
(missing shard, duplicated scenario, mismatched fingerprint, unfinished shard...), exits 1
and writes nothing. The merged run is a complete run written like an unsharded one, by the same
:func:`~pytest_memeval.core.results.finalize_run`: predictions in benchmark order, metrics
aggregated with :class:`~pytest_memeval.core.metrics.Tally` and checked by the independent
recount before ``metrics.json`` is written. Each shard is read by
:func:`~pytest_memeval.core.results.load_checked_run`, as ``memeval compare`` reads a run.
Closed-loop (episode) shard runs are merged by :mod:`pytest_memeval.tools.episode_merge`.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_memeval.core.formatting import counts_text, shown_ids
from pytest_memeval.core.history import describe_history, history_of
from pytest_memeval.core.metrics import METRICS_SCHEMA_VERSION
from pytest_memeval.core.records import Metrics, Record, ShardScope
from pytest_memeval.core.results import (
    FinalizeError,
    RunFacts,
    RunLoadError,
    finalize_run,
    load_checked_run,
)
from pytest_memeval.core.rundir import JOURNAL, METRICS
from pytest_memeval.core.runlayout import new_subset_dir, resume_target
from pytest_memeval.tools.compare import is_episode_run
from pytest_memeval.tools.episode_merge import merge_episode_shards
from pytest_memeval.tools.shard_checks import (
    MergeError,
    ShardNamed,
    agree,
    agree_fingerprints,
    check_numbering,
    load_all,
    out_problems,
    shard_scope_of,
    write_locked,
)

__all__ = ["MergeError", "ShardRun", "cli_arguments", "cli_main", "load_shard", "merge_shards"]


def _resumed(metrics: Metrics) -> int:
    """How many scenarios a shard's run resumed from its journal (``scope.resumed``)."""
    value = (metrics.get("scope") or {}).get("resumed")
    return value if isinstance(value, int) else 0


@dataclass
class ShardRun(ShardNamed):
    """One shard run directory, read and checked on its own."""

    path: Path
    metrics: Metrics
    shard: ShardScope
    ids: list[str]
    indices: list[int]
    #: its checked records, in its predictions' order (what the merge writes)
    records: list[Record] = field(default_factory=list, repr=False)


def load_shard(path: Path, problems: list[str]) -> ShardRun | None:
    """Read ``path`` as a finished shard run; append what is wrong with it to ``problems``."""
    try:
        checked = load_checked_run(path, shard=True)
    except RunLoadError as exc:
        problems.append(str(exc))
        return None
    metrics = checked.metrics
    # Files, records and the recount (predictions_sha256 included) were checked above.
    shard = shard_scope_of(path, metrics, problems)
    if shard is None:
        return None
    run = ShardRun(
        path=path,
        metrics=metrics,
        shard=shard,
        ids=list(checked.records),
        indices=[r["index"] for r in checked.records.values()],
        records=list(checked.records.values()),
    )
    missing = list(metrics.get("missing") or [])
    if missing:
        problems.append(
            f"{run.name}: incomplete, {len(missing)} scenario(s) have no result: "
            f"{shown_ids(missing)}"
        )
    not_selected = list(metrics.get("not_selected") or [])
    if not_selected:
        problems.append(
            f"{run.name}: only part of the shard was selected (-k or a deselection); "
            f"not run: {shown_ids(not_selected)}"
        )
    size = shard["size"]
    if len(run.ids) != size:
        problems.append(f"{run.name}: has {len(run.ids)} record(s), the shard has {size}")
    elif run.ids and (run.ids[0] != shard["first"] or run.ids[-1] != shard["last"]):
        problems.append(
            f"{run.name}: records run {run.ids[0]} .. {run.ids[-1]}, the shard is "
            f"{shard['first']} .. {shard['last']}"
        )
    expected = list(range(shard["start"], shard["stop"]))
    if all(isinstance(i, int) for i in run.indices) and run.indices != expected[: len(run.indices)]:
        problems.append(
            f"{run.name}: records are not benchmark positions {shard['start']}.."
            f"{shard['stop'] - 1} in order"
        )
    return run


def _settings(metrics: Metrics) -> dict[str, object]:
    decoding = dict(metrics.get("decoding") or {})
    decoding.pop("path", None)  # fast and reference give the same predictions by contract
    return decoding


def check_shards(runs: Sequence[ShardRun], problems: list[str]) -> None:
    """Cross-checks: same N, same checkpoint and fingerprints, shards 1..N each once, every
    scenario exactly once."""
    if not runs:
        return
    agree(runs, "metrics schema_version", lambda r: r.metrics.get("schema_version"), problems)
    if any(r.metrics.get("schema_version") != METRICS_SCHEMA_VERSION for r in runs):
        problems.append(
            f"shards were written with another metrics schema than this version "
            f"({METRICS_SCHEMA_VERSION}) of pytest-memeval"
        )
    agree(runs, "number of shards N", lambda r: r.shard["count"], problems)
    agree(runs, "benchmark size", lambda r: r.shard["benchmark_total"], problems)
    agree(runs, "checkpoint profile", lambda r: r.metrics.get("ckpt"), problems)
    agree(runs, "profile kind", lambda r: r.metrics.get("kind"), problems)
    # Teacher-forced and free-running shards answer different questions: one merged run
    # would mix them (their decoding fingerprints differ too; this says why).
    agree(runs, "history", lambda r: describe_history(history_of(r.metrics)), problems)
    agree_fingerprints(runs, problems)
    agree(runs, "decoding settings", lambda r: _settings(r.metrics), problems)
    # --memeval-model/--memeval-adapter/--memeval-set: the merged run says what it overrode.
    agree(runs, "overrides", lambda r: r.metrics.get("overrides") or {}, problems)

    seen = check_numbering(runs, "scenario", problems)
    total = runs[0].shard["benchmark_total"]
    if seen is not None and len(seen) != total:
        problems.append(f"the shards hold {len(seen)} scenario(s), the benchmark has {total}")


def merge_shards(paths: Sequence[Path], out: Path) -> Metrics:
    """Merge the shard runs in ``paths`` into the run directory ``out``; returns its metrics.

    Raises :class:`MergeError` (and writes nothing) unless the shards make exactly one
    complete run.
    """
    problems: list[str] = []
    out = out.resolve()
    runs = load_all(paths, load_shard, problems)
    check_shards(runs, problems)
    if problems:
        raise MergeError(problems + _out_problems(out, runs))
    return write_locked(out, lambda: _out_problems(out, runs), lambda: _write_merged(runs, out))


def _out_problems(out: Path, runs: Sequence[ShardRun]) -> list[str]:
    """Why the merge must not be written to ``out``."""
    return out_problems(out, runs, also=_unfinished_problems)


def _unfinished_problems(out: Path) -> list[str]:
    """``out`` holds the journal of an unfinished pytest run."""
    unfinished = resume_target(out)
    if unfinished is not None and (unfinished != out or not (out / METRICS).is_file()):
        return [
            f"-o {out}: holds the journal of an unfinished run ({unfinished / JOURNAL}); "
            "refusing to mix a merge into it"
        ]
    return []


def _write_merged(runs: list[ShardRun], out: Path) -> Metrics:
    runs.sort(key=lambda r: r.k)
    # Written beside the top level, then promoted like a finished pytest run: an earlier
    # merge there moves to previous/, and nothing is half-replaced if this one fails.
    stage = new_subset_dir(out, time.time())
    stage.mkdir(parents=True)
    records = (record for run in runs for record in run.records)
    try:
        done = finalize_run(records, _merged_facts(runs), stage=stage, run_dir=out)
    except FinalizeError as exc:  # pragma: no cover - the recount and Tally disagree: a bug
        _remove_stage(stage)
        raise MergeError(
            ["recount disagrees with the merged aggregate: " + "; ".join(exc.disagreements)]
        ) from None
    except BaseException:
        if not (stage / METRICS).is_file():
            # Failed before the merged run was written: nothing half-written is left behind
            # (the stage is this merge's own directory). With its metrics written, a failed
            # promotion leaves every file where runlayout.promote says, as for a pytest run.
            _remove_stage(stage)
        raise
    return done.metrics


def _remove_stage(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    with contextlib.suppress(OSError):
        stage.parent.rmdir()


def _merged_facts(runs: list[ShardRun]) -> RunFacts:
    """What the merged run's metrics say besides the counts: the shards' common settings."""
    first = runs[0].metrics
    total = sum(len(r.ids) for r in runs)
    walls = [(r.metrics.get("timing") or {}).get("wall_s") for r in runs]
    # Shards run side by side: the merged run took as long as its slowest shard.
    wall = max((w for w in walls if isinstance(w, (int, float))), default=None)
    paths_used = sorted({str((r.metrics.get("decoding") or {}).get("path")) for r in runs})
    return RunFacts(
        ckpt=first["ckpt"],
        kind=first["kind"],
        complete=True,
        scope={
            "benchmark_total": total,
            "in_scope": total,
            "selected": total,
            "evaluated": total,
            "subset": False,
            "shard": None,
            "resumed": sum(_resumed(r.metrics) for r in runs),
        },
        fingerprints=first.get("fingerprints") or {},
        decoding={**(first.get("decoding") or {}), "path": ",".join(paths_used)},
        benchmark=first.get("benchmark"),
        wall_s=wall,
        timing={"shard_wall_s": walls},
        extra={
            "merged_from": [
                {
                    "shard": r.shard["spec"],
                    "dir": str(r.path),
                    "n": len(r.ids),
                    "first": r.shard["first"],
                    "last": r.shard["last"],
                    "predictions_sha256": r.metrics.get("predictions_sha256"),
                }
                for r in runs
            ]
        },
        # Every shard has the same (check_shards), and a run without says {}.
        overrides=first.get("overrides") or {},
        history=history_of(first),
    )


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "shards",
        nargs="+",
        type=Path,
        metavar="SHARD_DIR",
        help="the run directories of pytest --memeval-shard 1/N .. N/N",
    )
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        required=True,
        metavar="OUT",
        help="run directory to write the merged run to (metrics.json + predictions.jsonl)",
    )
    parser.add_argument(
        "--allow-env-errors",
        action="store_true",
        help="closed-loop shards: merge episodes that ended in an environment error; the "
        "merged run then says it is incomplete (complete: false, its error_ids)",
    )


def cli_main(args: argparse.Namespace) -> int:
    if any(is_episode_run(path) for path in args.shards):
        return _episode_cli_main(args)
    try:
        metrics = merge_shards(args.shards, args.out)
    except MergeError as exc:
        print("memeval merge: refusing to merge, nothing written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(
        f"memeval merge: OK {len(metrics['merged_from'])} shards -> {args.out}: "
        + counts_text(metrics)
    )
    return 0


def _episode_cli_main(args: argparse.Namespace) -> int:
    """``memeval merge`` of closed-loop shard runs (tools/episode_merge.py)."""
    allow = bool(getattr(args, "allow_env_errors", False))
    try:
        metrics = merge_episode_shards(args.shards, args.out, allow_env_errors=allow)
    except MergeError as exc:
        print("memeval merge: refusing to merge, nothing written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    success = metrics["episodes"]["success"]
    state = "complete" if metrics["complete"] else f"INCOMPLETE: errors {metrics['error_ids']}"
    print(
        f"memeval merge: OK {len(metrics.get('merged_from') or [])} episode shards -> "
        f"{args.out}: {metrics['episodes']['episodes']} episode(s), success "
        f"{success['correct']}/{success['total']}; {state}"
    )
    return 0 if metrics["complete"] else 1
