"""``memeval merge`` of closed-loop shard runs: ``--memeval-shard K/N`` episode runs -> one run.

The episode counterpart of :mod:`pytest_memeval.tools.merge` (which hands episode runs here).
Shards are merged only if each is a finished shard run whose ``metrics.json`` recounts equal
to its ``predictions.jsonl`` (:func:`~pytest_memeval.core.episode_records.recount_episodes`),
holds exactly the episodes of its slice of the seeds (``core/sharding.shard_slice``, the
scenario runs' split rule), and together they are shards 1..N of the same N that agree on
the profile, every fingerprint (model, adapter, tokenizer, decoding, environment) and the
environment (backend and version, game, parameters, fold, seeds, limits). A shard with an
environment error is refused (rerun it with ``--memeval-resume``) unless the merge is asked to
keep such episodes (``--allow-env-errors``): the merged run then says so (``complete: false``,
its ``error_ids``). Otherwise :class:`MergeError` lists every problem, naming the shard, and
nothing is written (the checks of a set of shards and the error type are both merges':
:mod:`pytest_memeval.tools.shard_checks`). The merged run is written by
:func:`~pytest_memeval.core.episode_records.finalize_episode_run`, as an unsharded run is: its
records in the order of the seeds, its numbers counted again from the file written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    EpisodeRecordError,
    EpisodeRunMetrics,
    MergedShard,
    finalize_episode_run,
    read_episode_records,
    recount_episodes,
)
from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.records import ShardScope
from pytest_memeval.core.rundir import METRICS, PREDICTIONS, read_json
from pytest_memeval.core.runlayout import resume_target
from pytest_memeval.core.sharding import shard_slice
from pytest_memeval.tools.compare import EPISODES_KIND
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

__all__ = [
    "EpisodeShard",
    "MergeError",
    "check_episode_shards",
    "load_episode_shard",
    "merge_episode_shards",
]


def all_ids(env: dict[str, Any]) -> list[str] | None:
    """Every episode id of the environment a run is of (``<game>-<seed>`` in seed order)."""
    seeds, game = env.get("seeds"), env.get("game")
    if not isinstance(seeds, list) or not isinstance(game, str):
        return None
    return [f"{game}-{seed}" for seed in seeds]


@dataclass
class EpisodeShard(ShardNamed):
    """One episode shard run directory, read and checked on its own."""

    path: Path
    metrics: dict[str, Any]
    shard: ShardScope
    #: its checked records, in its predictions' order
    records: list[EpisodeRecord] = field(default_factory=list, repr=False)

    @property
    def ids(self) -> list[str]:
        """The episode ids of its records."""
        return [r["id"] for r in self.records]

    @property
    def error_ids(self) -> list[str]:
        """Its episodes that ended in an environment error."""
        return [str(i) for i in self.metrics.get("error_ids") or []]


def _read(path: Path, problems: list[str]) -> tuple[dict[str, Any], list[EpisodeRecord]] | None:
    """The metrics and records of the run at ``path``, recounted; problems appended."""
    if not (path / METRICS).is_file():
        # Unfinished runs are kept in subsets/<time>/ (runlayout.py).
        unfinished = resume_target(path) if path.is_dir() else None
        hint = f" (an unfinished run is in {unfinished}: --memeval-resume)" if unfinished else ""
        problems.append(f"{path}: no {METRICS}: not a finished run{hint}")
        return None
    newer = resume_target(path)
    if newer is not None and newer != path:
        problems.append(
            f"{path}: a newer unfinished run of this shard is in {newer}; finish it "
            "(pytest --memeval-resume) or remove that directory before merging"
        )
        return None
    try:
        metrics = read_json(path / METRICS)
    except (OSError, ValueError) as exc:
        problems.append(f"{path / METRICS}: unreadable ({exc})")
        return None
    if not isinstance(metrics, dict) or metrics.get("kind") != EPISODES_KIND:
        problems.append(f"{path}: not a closed-loop (episode) run; cannot merge it with episodes")
        return None
    try:
        records = read_episode_records(path / PREDICTIONS)
        differences = recount_episodes(path / PREDICTIONS, metrics)
    except FileNotFoundError:
        problems.append(f"{path}: no {PREDICTIONS}")
        return None
    except (OSError, EpisodeRecordError) as exc:
        problems.append(str(exc))
        return None
    if differences:
        problems.append(
            f"{path / METRICS}: disagrees with its {PREDICTIONS} on recount: "
            + ", ".join(differences)
        )
        return None
    return metrics, records


def load_episode_shard(
    path: Path, problems: list[str], allow_env_errors: bool = False
) -> EpisodeShard | None:
    """Read ``path`` as a finished episode shard run; what is wrong goes to ``problems``."""
    read = _read(path, problems)
    if read is None:
        return None
    metrics, records = read
    shard = shard_scope_of(path, metrics, problems)
    if shard is None:
        return None
    run = EpisodeShard(path=path, metrics=metrics, shard=shard, records=records)
    missing = [str(i) for i in metrics.get("missing") or []]
    if missing:
        problems.append(
            f"{run.name}: incomplete, {len(missing)} episode(s) have no record: "
            f"{shown_ids(missing)}"
        )
    if run.error_ids and not allow_env_errors:
        problems.append(
            f"{run.name}: environment error in {len(run.error_ids)} episode(s) "
            f"({shown_ids(run.error_ids)}); rerun the shard with --memeval-resume, or merge "
            "with --allow-env-errors for a merged run that says it is incomplete"
        )
    ids = all_ids(metrics.get("env") or {})
    if ids is None:
        problems.append(f"{path / METRICS}: its 'env' names no game and seeds")
    elif len(ids) != shard["benchmark_total"]:
        problems.append(
            f"{run.name}: its env has {len(ids)} seed(s), its scope.shard says "
            f"{shard['benchmark_total']}"
        )
    else:
        expected = shard_slice(ids, shard["index"], shard["count"])
        if run.ids != expected:
            problems.append(
                f"{run.name}: holds episodes {shown_ids(run.ids)}, shard {shard['spec']} of the "
                f"seeds is {shown_ids(expected)}"
            )
    return run


def check_episode_shards(runs: Sequence[EpisodeShard], problems: list[str]) -> None:
    """Cross-checks: same N, profile, fingerprints and env; shards 1..N each once, every
    episode of the seeds exactly once."""
    if not runs:
        return
    agree(runs, "number of shards N", lambda r: r.shard["count"], problems)
    agree(runs, "profile", lambda r: r.metrics.get("profile"), problems)
    agree(runs, "env", lambda r: r.metrics.get("env"), problems)
    agree_fingerprints(runs, problems)
    seen = check_numbering(runs, "episode", problems)
    if seen is None:
        return  # the numbering or an episode given twice is already reported
    ids = all_ids(runs[0].metrics.get("env") or {}) or []
    uncovered = [i for i in ids if i not in seen]
    if uncovered:
        problems.append(f"the shards lack {len(uncovered)} episode(s): {shown_ids(uncovered)}")


def merge_episode_shards(
    paths: Sequence[Path], out: Path, *, allow_env_errors: bool = False
) -> EpisodeRunMetrics:
    """Merge the episode shard runs in ``paths`` into the run directory ``out``.

    Raises :class:`MergeError` (and writes nothing) unless the shards make exactly one run of
    every seed.
    """
    problems: list[str] = []
    out = Path(out).resolve()
    runs = load_all(
        paths, lambda path, found: load_episode_shard(path, found, allow_env_errors), problems
    )
    check_episode_shards(runs, problems)
    problems += out_problems(out, runs)
    if problems:
        raise MergeError(problems)
    return write_locked(
        out,
        lambda: out_problems(out, runs),  # again, under the lock
        lambda: _write_merged(sorted(runs, key=lambda r: r.k), out),
    )


def _write_merged(runs: list[EpisodeShard], out: Path) -> EpisodeRunMetrics:
    first = runs[0].metrics
    records = {r["id"]: r for run in runs for r in run.records}
    walls = [run.metrics.get("wall_s") for run in runs]
    merged_from: list[MergedShard] = [
        {
            "shard": run.shard["spec"],
            "dir": str(run.path),
            "n": len(run.records),
            "first": run.shard["first"],
            "last": run.shard["last"],
        }
        for run in runs
    ]
    # An earlier merge's metrics go first: a reader never sees them beside new predictions.
    (out / METRICS).unlink(missing_ok=True)
    try:
        return finalize_episode_run(
            out,
            profile=str(first.get("profile")),
            env=first.get("env") or {},
            fingerprints=first.get("fingerprints") or {},
            ids=all_ids(first.get("env") or {}) or [],
            records=records,
            # Shards run side by side: the merged run took as long as its slowest shard.
            wall_s=max((w for w in walls if isinstance(w, (int, float))), default=None),
            merged_from=merged_from,
        )
    except EpisodeRecordError as exc:  # pragma: no cover - the recount disagrees: a bug
        (out / PREDICTIONS).unlink(missing_ok=True)
        raise MergeError([f"-o {out}: {exc}"]) from None
