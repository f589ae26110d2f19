"""Where each run lands inside a run directory, so no pytest habit destroys a finished run.

``runs/<ckpt>/`` (or ``--memeval-out DIR``, or a shard's ``shard-K-of-N/``):

* the top level holds the newest **finished** run only (``complete: true``, or a shard with
  every scenario of its slice): ``metrics.json``, ``predictions.jsonl``, ``journal.jsonl``.
  ``memeval compare``, ``report``, ``recount``, ``merge``, the gate's ``--memeval-baseline``
  and replay profiles read these files, as before;
* ``previous/`` holds the finished run that the newest one replaced (one generation);
* ``subsets/<UTC start time>/`` holds every run that did not finish: a ``-k`` / ``--lf`` /
  ``--deselect`` subset, a run stopped by ``-x`` or Ctrl-C, a run with a missing result, or
  a run whose controller was killed (then only its journal is there).

Every run journals into a new ``subsets/<time>/`` directory from its first record on. When it
ends finished, its files are *promoted* to the top level (the finished run there moves to
``previous/``); otherwise they stay where they are, and the top level is untouched.
``--memeval-resume`` continues the newest unfinished run that started after the top-level
run was written (:func:`resume_target`), in place.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from pathlib import Path
from typing import Any

from pytest_memeval.core.rundir import (
    JOURNAL,
    JOURNAL_PREVIOUS,
    METRICS,
    PREDICTIONS,
    fsync_dir,
    read_json,
)

__all__ = [
    "PREVIOUS",
    "RUN_FILES",
    "SUBSETS",
    "describe_stranded",
    "finished",
    "new_subset_dir",
    "promote",
    "resume_target",
    "stranded",
    "top_level_run",
]

SUBSETS = "subsets"
PREVIOUS = "previous"
#: The files of one run, in the order a promotion moves them *away* (metrics first, so a
#: reader never sees metrics beside another run's predictions). Moving *in* is the reverse.
RUN_FILES = (METRICS, PREDICTIONS, JOURNAL, JOURNAL_PREVIOUS)
_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


def finished(metrics: Any) -> bool:
    """Whether ``metrics`` describe a finished run: every in-scope scenario has a result.

    A complete run is finished; so is a shard run that covers its whole slice (its metrics
    say ``complete: false`` because a slice is not the benchmark, but it is what
    ``memeval merge`` needs, at the top of its shard directory).
    """
    return (
        isinstance(metrics, dict)
        and not metrics.get("missing")
        and not metrics.get("not_selected")
        and (bool(metrics.get("complete")) or bool((metrics.get("scope") or {}).get("shard")))
    )


def top_level_run(run_dir: Path) -> dict[str, Any] | None:
    """The metrics of the finished run at the top of ``run_dir``, or ``None``."""
    try:
        metrics = read_json(run_dir / METRICS)
    except (OSError, ValueError):
        return None
    return metrics if finished(metrics) else None


def new_subset_dir(run_dir: Path, started: float) -> Path:
    """A not yet existing ``subsets/<UTC start time>`` path for a run started at ``started``.

    Only the name is chosen here; the directory is created when the run has its first record
    (a run that evaluates nothing leaves no trace).
    """
    stamp = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime(_TIME_FORMAT)
    base = run_dir / SUBSETS
    candidate, k = base / stamp, 1
    while candidate.exists():
        k += 1
        candidate = base / f"{stamp}-{k}"
    return candidate


def _started(subset: Path) -> _dt.datetime | None:
    try:
        stamp = _dt.datetime.strptime(subset.name.split("-", 1)[0], _TIME_FORMAT)
    except ValueError:
        return None
    return stamp.replace(tzinfo=_dt.timezone.utc)


def resume_target(run_dir: Path) -> Path | None:
    """The directory whose journal ``--memeval-resume`` continues, ``None`` if there is none.

    The newest ``subsets/<time>/`` holding a journal that started after the top-level run was
    written (an unfinished run newer than the finished one); otherwise ``run_dir`` itself if
    it has a journal (a finished run: nothing left to do; or a run directory of an older
    version, which kept unfinished runs at the top level).
    """
    try:
        top = read_json(run_dir / METRICS)
    except (OSError, ValueError):
        top = None  # none, or damaged: no finished run to be newer than (as top_level_run)
    written: _dt.datetime | None = None
    if isinstance(top, dict) and isinstance(top.get("created"), str):
        try:
            written = _dt.datetime.fromisoformat(top["created"])
        except ValueError:
            written = None
    candidates = []
    subsets = run_dir / SUBSETS
    if subsets.is_dir():
        for path in subsets.iterdir():
            start = _started(path)
            if start is None or not (path / JOURNAL).is_file():
                continue
            if written is None or start >= written.replace(microsecond=0):
                candidates.append((start, path.name, path))
    if candidates:
        return max(candidates)[2]
    return run_dir if (run_dir / JOURNAL).is_file() else None


def stranded(run_dir: Path) -> list[Path]:
    """Hidden ``.previous.<pid>.tmp``/``.old`` directories a crashed :func:`promote` left.

    ``.tmp`` holds the finished run that was at the top level, ``.old`` the one that was in
    ``previous/``. They are never removed or read by another run: the user decides.
    """
    return sorted(
        path
        for path in run_dir.glob(f".{PREVIOUS}.*")
        if path.is_dir() and path.suffix in (".tmp", ".old")
    )


def describe_stranded(path: Path) -> str:
    """One line saying what a :func:`stranded` directory holds and what to do with it."""
    try:
        created = read_json(path / METRICS).get("created", "?")
    except (OSError, ValueError, AttributeError):
        created = "?"
    return (
        f"memeval: {path} holds a finished run (created {created}) that an interrupted "
        "promotion left behind; nothing reads it there: move its files back into "
        f"{path.parent} or {path.parent / PREVIOUS}, or delete it"
    )


def _unused(run_dir: Path, suffix: str) -> Path:
    candidate, k = run_dir / f".{PREVIOUS}.{os.getpid()}{suffix}", 1
    while candidate.exists():
        k += 1
        candidate = run_dir / f".{PREVIOUS}.{os.getpid()}-{k}{suffix}"
    return candidate


def promote(stage: Path, run_dir: Path) -> Path | None:
    """Make the finished run in ``stage`` the top-level run of ``run_dir``.

    The finished run at the top level (if any) moves to ``previous/`` (replacing the one
    there), by way of a hidden ``.previous.<pid>.tmp/`` directory. Every step is a rename: a
    crash between two steps leaves the top level without ``metrics.json`` (no result, rather
    than a wrong one) and every file in ``stage``, ``previous/`` or a hidden
    ``.previous.<pid>.tmp/`` (or ``.old/``) directory, which :func:`stranded` finds and the
    next run reports (nothing else reads it there). Returns the ``previous/`` path when a run
    was moved there.
    """
    kept: Path | None = None
    present = [name for name in RUN_FILES if (run_dir / name).is_file()]
    if present:
        # Never reuse a name: a stranded directory of a crashed promotion with the same pid
        # (containers recycle small pids) holds a finished run.
        fresh = _unused(run_dir, ".tmp")
        fresh.mkdir()
        for name in present:
            (run_dir / name).replace(fresh / name)
        fsync_dir(run_dir)
        kept = run_dir / PREVIOUS
        old = _unused(run_dir, ".old")
        if kept.exists():
            kept.replace(old)
        fresh.replace(kept)
        shutil.rmtree(old, ignore_errors=True)
    for name in reversed(RUN_FILES):  # metrics.json last
        if (stage / name).is_file():
            (stage / name).replace(run_dir / name)
    fsync_dir(run_dir)
    for directory in (stage, stage.parent):
        if directory != run_dir:
            try:
                directory.rmdir()  # only when empty: anything else is left where it is
            except OSError:
                break
    return kept
