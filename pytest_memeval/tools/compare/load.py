"""Which runs a comparison takes: loading each, refusing a pair or set that would mislead,
and naming the runs.

Only complete runs that pass the independent recount are compared
(:func:`load_run`), only over the same scenario ids (:func:`check_same_ids`), and runs of
two histories only when nothing else differs (:func:`check_one_question`; a leaderboard
takes runs of one history only, :func:`check_one_history`). Each refusal is a
:class:`~pytest_memeval.tools.compare.types.CompareError` whose message says why. The labels
(:func:`pair_labels`, :func:`run_labels`) are what the tables call the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.history import history_of, history_words, other_differences
from pytest_memeval.core.records import Metrics
from pytest_memeval.core.results import RunLoadError, load_checked_run
from pytest_memeval.tools.compare.types import CompareError, RunData

__all__ = [
    "PairLabels",
    "check_one_history",
    "check_one_question",
    "check_same_ids",
    "load_run",
    "pair_labels",
    "run_labels",
]


class PairLabels(NamedTuple):
    """What the comparison of a pair calls run A and run B."""

    a: str
    b: str


def load_run(path: Path) -> RunData:
    """Load a run directory for comparison; raise :class:`CompareError` if it is not usable.

    Refused: whatever :func:`~pytest_memeval.core.results.load_checked_run` refuses (no run
    directory, no ``metrics.json``/``predictions.jsonl``, a malformed file or record, metrics
    that disagree with the recount of the predictions), and an incomplete run (missing
    scenarios, a subset selected with ``-k``, or one shard).
    """
    try:
        run = load_checked_run(path)
    except RunLoadError as exc:
        raise CompareError(str(exc)) from None
    if run.metrics.get("complete") is not True:
        raise CompareError(
            f"{path}: incomplete run, refusing to compare it ({_why_incomplete(run.metrics)})"
        )
    return run


def _why_incomplete(metrics: Metrics) -> str:
    missing = metrics.get("missing") or []
    if missing:
        return f"{len(missing)} scenario(s) have no result: {shown_ids(missing)}"
    scope = metrics.get("scope") or {}
    if scope.get("shard"):
        shard = scope["shard"]
        spec = shard.get("spec", shard) if isinstance(shard, dict) else shard
        return f"it is shard {spec}; merge the shards first (memeval merge)"
    if scope.get("subset"):
        return (
            f"only {scope.get('evaluated')} of {scope.get('in_scope')} scenarios were selected "
            "(-k or a deselection)"
        )
    return "metrics.json says complete: false"


def check_same_ids(run_a: RunData, run_b: RunData) -> None:
    """Refuse two runs that cover different scenario ids, naming those only in one."""
    refuse_different_ids(
        list(run_a.records), list(run_b.records), str(run_a.path), str(run_b.path), "scenarios"
    )


def refuse_different_ids(
    ids_a: Sequence[str], ids_b: Sequence[str], a: str, b: str, what: str
) -> None:
    """Raise :class:`CompareError` when two runs cover different ids (``what``: scenarios,
    episodes), naming those only in run ``a`` and those only in run ``b``."""
    if set(ids_a) == set(ids_b):
        return
    only_a = [i for i in ids_a if i not in set(ids_b)]
    only_b = [i for i in ids_b if i not in set(ids_a)]
    parts = []
    if only_a:
        parts.append(f"{len(only_a)} only in {a}: {shown_ids(only_a)}")
    if only_b:
        parts.append(f"{len(only_b)} only in {b}: {shown_ids(only_b)}")
    raise CompareError(f"the runs cover different {what}: " + "; ".join(parts))


def check_one_question(run_a: RunData, run_b: RunData) -> None:
    """Refuse two runs whose histories differ when anything else differs too: the gap would
    mix the history's effect with the other difference's."""
    ha, hb = history_of(run_a.metrics), history_of(run_b.metrics)
    if ha == hb:
        return
    differ = other_differences(run_a.metrics, run_b.metrics)
    if differ:
        raise CompareError(
            f"A ({run_a.path}) is {history_words(ha)} (history {ha}) and B ({run_b.path}) "
            f"{history_words(hb)} (history {hb}), and they differ in more than that: "
            + "; ".join(differ)
            + ". Compare runs of one history, or the two histories of one checkpoint "
            "(memeval compare runs/<ckpt> runs/<ckpt>@history-model)"
        )


def check_one_history(runs: Sequence[RunData]) -> None:
    """Refuse a leaderboard of runs of more than one history (teacher-forced, free-running)."""
    histories = [history_of(run.metrics) for run in runs]
    if len(set(histories)) > 1:
        shown = ", ".join(
            f"{run.path}: {history_words(h)}" for run, h in zip(runs, histories, strict=True)
        )
        raise CompareError(
            f"the runs mix teacher-forced and free-running results ({shown}); a leaderboard "
            "ranks runs of one history. Compare the two histories of one checkpoint on their "
            "own: memeval compare RUN_TRUTH RUN_MODEL"
        )


def pair_labels(run_a: RunData, run_b: RunData) -> PairLabels:
    """The checkpoints' names, with each run's history where the histories differ; the
    paths where that leaves the two names alike."""
    labels = PairLabels(run_a.ckpt, run_b.ckpt)
    ha, hb = history_of(run_a.metrics), history_of(run_b.metrics)
    if ha != hb:
        labels = PairLabels(
            f"{labels.a} ({history_words(ha)})", f"{labels.b} ({history_words(hb)})"
        )
    if labels.a == labels.b:
        labels = PairLabels(str(run_a.path), str(run_b.path))
    return labels


def run_labels(runs: Sequence[RunData]) -> list[str]:
    """Checkpoint names, or the paths where names repeat."""
    names = [run.ckpt for run in runs]
    if len(set(names)) == len(names):
        return names
    return [str(run.path) for run in runs]
