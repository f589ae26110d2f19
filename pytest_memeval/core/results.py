"""A run's results, written and read back: the one path each way.

* :func:`finalize_run` finishes a run: it writes ``predictions.jsonl`` from the records (in the
  order given), tallies them as they stream, recounts the written file independently, builds
  the ``metrics.json`` document, writes it, and promotes the directory it wrote to the top of
  the run directory when the run is finished (:mod:`.runlayout`). The controller (end of a
  pytest session) and ``memeval merge`` both call it, so a merged run is written exactly like
  an unsharded one.
* :func:`load_checked_run` reads a finished run directory back, for ``memeval compare``, the
  gate's ``--memeval-baseline``, ``memeval report`` and ``memeval merge``: both files present
  and readable, every record well formed, the recount (counts, intervals, predictions hash)
  agreeing with ``metrics.json``. Anything else is refused with one message naming the file
  (and line) and what is wrong.

Everything here is plain data in and out: what a run *is* (checkpoint, fingerprints,
decoding, scope, timing) comes from the caller, so this module depends on nothing above
``core``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pytest_memeval.core.history import HISTORY_TRUTH
from pytest_memeval.core.metrics import Tally, metrics_document
from pytest_memeval.core.records import (
    Fingerprints,
    Metrics,
    Record,
    RecordError,
    read_records,
    validate_metrics,
)
from pytest_memeval.core.recount import RecountError, compare_counts, recount_file, recount_run
from pytest_memeval.core.rundir import (
    JOURNAL,
    METRICS,
    PREDICTIONS,
    atomic_write,
    sha256_file,
    write_json,
)
from pytest_memeval.core.runlayout import SUBSETS, finished, promote, resume_target

__all__ = [
    "CheckedRun",
    "ExtraFields",
    "FinalizeError",
    "FinishedRun",
    "RunFacts",
    "RunLoadError",
    "finalize_run",
    "load_checked_run",
]


# -- writing: finalize_run ------------------------------------------------------------------


class FinalizeError(RuntimeError):
    """The independent recount of the written predictions disagrees with their tally.

    A bug in the counting code, never bad input: ``metrics.json`` is then not written (the
    predictions file is removed too), and ``disagreements`` says each field that differs.
    """

    def __init__(self, disagreements: Sequence[str]) -> None:
        super().__init__("recount disagrees with the aggregate: " + "; ".join(disagreements))
        self.disagreements = list(disagreements)


class ExtraFields(TypedDict, total=False):
    """Top-level ``metrics.json`` fields only some writers add (``RunFacts.extra``)."""

    #: ``memeval merge``: one entry per shard (docs/results-schema.md)
    merged_from: list[dict[str, object]]


@dataclass(frozen=True)
class RunFacts:
    """What ``metrics.json`` says about a run besides its counts (plain data from the caller).

    ``wall_s`` is the run's wall time (``scenarios_per_s`` is derived from it);
    ``timing`` holds further timing fields (a merge's ``shard_wall_s``); ``extra`` further
    top-level fields (a merge's ``merged_from``). See docs/results-schema.md.
    """

    ckpt: str
    kind: str
    complete: bool
    scope: Mapping[str, object]
    fingerprints: Mapping[str, str | None] | Fingerprints
    decoding: Mapping[str, object]
    benchmark: dict[str, object] | None
    wall_s: float | None
    missing: Sequence[str] = ()
    not_selected: Sequence[str] = ()
    #: --memeval-model/--memeval-adapter/--memeval-set: what differs from the profile
    overrides: Mapping[str, object] = field(default_factory=dict)
    timing: Mapping[str, object] = field(default_factory=dict)
    extra: ExtraFields = field(default_factory=ExtraFields)
    #: ``truth`` (teacher-forced) or ``model`` (free-running); every record must say the same
    history: str = HISTORY_TRUTH


@dataclass(frozen=True)
class FinishedRun:
    """Where :func:`finalize_run` wrote a run, and its metrics document."""

    metrics: Metrics
    #: the directory the files were written into (a ``subsets/<time>/`` or the run directory)
    stage: Path
    #: where the files are now: the run directory when the run was promoted, else ``stage``
    written: Path
    #: the ``previous/`` directory that now holds the finished run a promotion replaced
    kept_previous: Path | None = None

    @property
    def promoted(self) -> bool:
        return self.written != self.stage


class _Batches:
    """``mean_batch``/``batch_size`` of the records a batched forward pass decoded: the mean
    of each record's ``decode_batch`` (scenarios in its forward pass: a scenario-weighted
    mean) and the largest ``decode_batch_size`` (the most a pass may hold under the batching
    rules of its device and dtype). The same on every device; docs/decoding.md, "What
    ``mean batch M of B`` is"."""

    def __init__(self) -> None:
        self.n = self.total = self.largest = 0

    def add(self, record: Record) -> None:
        batch = record.get("decode_batch")
        if isinstance(batch, int):
            self.n += 1
            self.total += batch
            self.largest = max(self.largest, int(record["decode_batch_size"]))

    def timing(self) -> dict[str, object]:
        """Empty when no record was decoded in a batch (reference path, replay)."""
        if not self.n:
            return {}
        return {"mean_batch": round(self.total / self.n, 3), "batch_size": self.largest}


def _lines(records: Iterable[Record], tally: Tally, batches: _Batches) -> Iterator[str]:
    for record in records:
        tally.add(record)
        batches.add(record)
        yield json.dumps(record, ensure_ascii=False) + "\n"


def finalize_run(
    records: Iterable[Record], facts: RunFacts, *, stage: Path, run_dir: Path
) -> FinishedRun:
    """Write a run's ``predictions.jsonl`` and ``metrics.json`` into ``stage`` and promote it.

    ``records`` are streamed (a journal's records are never all in memory) in the order they
    are written: benchmark order. The predictions file is written atomically and counted on
    the way (:class:`~.metrics.Tally`); the written file is then recounted with the separate
    code of :mod:`.recount`, and only when both agree is ``metrics.json`` written, atomically,
    last. A finished run (:func:`.runlayout.finished`) written beside the top level
    (``stage != run_dir``) is then promoted to the top of ``run_dir``; the finished run it
    replaces moves to ``previous/``.

    Raises :class:`FinalizeError` (nothing written) when the recount disagrees, and lets
    ``OSError`` of the writes through (no ``metrics.json`` is then written either).
    """
    predictions = stage / PREDICTIONS
    tally, batches = Tally(), _Batches()
    atomic_write(predictions, _lines(records, tally, batches))
    try:
        # The run's own history is what the tally claims: every record must say it too.
        disagreements = compare_counts(
            {**tally.counts(), "history": facts.history}, recount_file(predictions)
        )
    except RecountError as exc:  # a record whose facts disagree with its turns: a bug
        disagreements = [str(exc)]
    if disagreements:
        predictions.unlink()
        raise FinalizeError(disagreements)
    wall = facts.wall_s
    metrics = metrics_document(
        tally,
        ckpt=facts.ckpt,
        kind=facts.kind,
        complete=facts.complete,
        scope=facts.scope,
        missing=list(facts.missing),
        not_selected=list(facts.not_selected),
        fingerprints=facts.fingerprints,
        decoding=facts.decoding,
        benchmark=facts.benchmark,
        predictions_sha256=sha256_file(predictions),
        timing={
            "wall_s": wall,
            "scenarios_per_s": round(tally.n / wall, 3) if wall else None,
            **batches.timing(),
            **facts.timing,
        },
        merged_from=facts.extra.get("merged_from"),
        overrides=facts.overrides,
        history=facts.history,
    )
    write_json(stage / METRICS, metrics)
    if finished(metrics) and stage != run_dir:
        # Only a finished run takes the top level; the one there moves to previous/.
        kept = promote(stage, run_dir)
        return FinishedRun(metrics=metrics, stage=stage, written=run_dir, kept_previous=kept)
    return FinishedRun(metrics=metrics, stage=stage, written=stage)


# -- reading: load_checked_run --------------------------------------------------------------


class RunLoadError(ValueError):
    """A run directory that cannot be used; the message names the file (and line) and why."""


@dataclass(frozen=True)
class CheckedRun:
    """A run directory read back and checked: its metrics and its records by scenario id, in
    the order of ``predictions.jsonl`` (benchmark order)."""

    path: Path
    metrics: Metrics
    records: dict[str, Record]

    @property
    def ckpt(self) -> str:
        return str(self.metrics.get("ckpt", self.path.name))


def load_checked_run(path: Path, *, shard: bool = False) -> CheckedRun:
    """Read the finished run at the top of ``path``; raise :class:`RunLoadError` if unusable.

    Refused, each with one message naming the file (and line): a path that is not a
    directory; no ``metrics.json`` (an unfinished run, with a hint when its journal exists);
    no ``predictions.jsonl``; an unreadable or malformed file; a record that is not a
    scenario record, or an id twice; metrics that disagree with the recount of the
    predictions (counts, intervals, ``predictions_sha256``: a file edited after the run).

    ``shard``: read a shard run for ``memeval merge`` (and the Slurm shard check): the
    messages say "shard", and a newer unfinished run of the shard in ``subsets/<time>/`` is
    refused too (that shard is being re-run: its finished run at the top is not the one the
    user works on). ``memeval compare`` and the gate read the finished run at the top
    whatever is being run beside it, as the terminal summary of such a run says.

    Whether the run is *complete* (or a shard, or a subset) is the caller's question: the
    result says what its metrics say.
    """
    if not path.is_dir():
        raise RunLoadError(f"{path}: not a run directory")
    if not (path / METRICS).is_file():
        # Unfinished runs are kept in subsets/<time>/ (runlayout.py); older versions left
        # their journal at the top.
        unfinished = (path / JOURNAL).is_file() or any((path / SUBSETS).glob(f"*/{JOURNAL}"))
        hint = (
            f" (its journal exists: the {'shard ' if shard else ''}run did not finish; rerun "
            "it with --memeval-resume)"
            if unfinished
            else ""
        )
        raise RunLoadError(f"{path}: no {METRICS}: not a finished run{hint}")
    if shard:
        newer = resume_target(path)
        if newer is not None and newer != path:
            raise RunLoadError(
                f"{path}: a newer unfinished run of this shard is in {newer}; finish it "
                "(pytest --memeval-resume) or remove that directory before merging"
            )
    if not (path / PREDICTIONS).is_file():
        raise RunLoadError(f"{path / PREDICTIONS}: missing (it belongs beside {METRICS})")
    metrics = _read_metrics(path / METRICS)
    records = _read_records(path / PREDICTIONS)
    try:
        # The files were read and checked just above: recount those, not a second parse.
        recount_run(path, claimed=metrics, records=records.values())
    except RecountError as exc:
        raise RunLoadError(f"{path}: fails the recount: {exc}") from None
    except OSError as exc:  # a file removed or made unreadable since it was read above
        raise RunLoadError(f"{path}: unreadable run: {exc}") from None
    return CheckedRun(path=path, metrics=metrics, records=records)


def _read_metrics(path: Path) -> Metrics:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RunLoadError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise RunLoadError(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        metrics = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunLoadError(
            f"{path}: malformed JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    try:
        return validate_metrics(metrics, str(path))
    except RecordError as exc:
        raise RunLoadError(str(exc)) from None


def _read_records(path: Path) -> dict[str, Record]:
    # One validator for every reader of records (core/records/): a malformed line is
    # refused here with its file, line, scenario and field, never later as a KeyError.
    try:
        return {record["id"]: record for record in read_records(path)}
    except RecordError as exc:
        raise RunLoadError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise RunLoadError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise RunLoadError(f"{path}: unreadable ({exc.strerror or exc})") from None
