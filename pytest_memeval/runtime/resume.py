"""``--memeval-resume``: finish an interrupted run without redoing what its journal holds.

The journal (``runs/<ckpt>/journal.jsonl``) starts with a header line naming what the run
evaluates: the benchmark, model, adapter and decoding fingerprints, the decode path, the
history (teacher-forced or free-running) and the parse rules. A resumed run

1. reads that header and refuses, listing every difference, unless the current run would
   evaluate exactly the same thing (mixing records of two checkpoints is not a result);
2. recovers the journal's records (a torn last line from a crash is dropped), checks each
   one it takes with ``core.records.validate_record`` (a damaged one refuses the resume,
   naming the file, line, scenario and field) and keeps only their offsets;
3. deselects, at collection, every item of a scenario the journal already has: on the
   controller and on each xdist worker alike, from the same plain list of ids (workers get it
   through ``workerinput``, so every process collects the same items);
4. appends the new records to the same journal, so predictions and metrics at the end cover
   the old and new records together and equal an uninterrupted run's.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.formatting import shorten
from pytest_memeval.core.history import describe_history, history_of
from pytest_memeval.core.records import RecordError, validate_record
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY, Journal
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.state import MemevalState, workerinput

__all__ = [
    "JOURNAL_FORMAT",
    "ResumeError",
    "ResumePoint",
    "ResumeSelection",
    "header_differences",
    "journal_header",
    "register_worker_resume",
    "resume_point",
]

#: Version of the journal header; a journal with another version is not resumed.
JOURNAL_FORMAT = 1

#: Header fields that must be equal for a resume (besides every fingerprint).
_COMPARED = ("kind", "decode_path", "parse")


class ResumeError(ValueError):
    """The journal cannot be resumed by this run; the message says why (and what differs)."""


def journal_header(state: MemevalState) -> dict[str, Any]:
    """The header line of a new journal: what this run evaluates, as plain JSON data."""
    profile = state.profile
    return {
        JOURNAL_HEADER_KEY: JOURNAL_FORMAT,
        "ckpt": profile.name,
        "kind": profile.kind,
        "decode_path": state.decode_path,
        "history": state.history,
        "fingerprints": dict(state.fingerprints),
        "parse": {"final": profile.parse.final, "turn": profile.parse.turn},
        "benchmark_source": state.benchmark.source,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _short(value: Any) -> str:
    return shorten(repr(value), 40)


def header_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why a journal written with header ``old`` cannot be continued by a run with ``new``."""
    diffs: list[str] = []
    if old.get(JOURNAL_HEADER_KEY) != new.get(JOURNAL_HEADER_KEY):
        diffs.append(
            f"journal format {old.get(JOURNAL_HEADER_KEY)!r}, this version writes "
            f"{new.get(JOURNAL_HEADER_KEY)!r}"
        )
    old_fps = old.get("fingerprints") or {}
    new_fps = new.get("fingerprints") or {}
    for key in sorted(set(old_fps) | set(new_fps)):
        if old_fps.get(key) != new_fps.get(key):
            diffs.append(
                f"{key} fingerprint: journal {_short(old_fps.get(key))}, "
                f"now {_short(new_fps.get(key))}"
            )
    for key in _COMPARED:
        if old.get(key) != new.get(key):
            diffs.append(f"{key}: journal {_short(old.get(key))}, now {_short(new.get(key))}")
    # A journal written before free-running runs existed was teacher-forced.
    if history_of(old) != history_of(new):
        diffs.append(
            f"history: journal {describe_history(history_of(old))}, now "
            f"{describe_history(history_of(new))}"
        )
    return diffs


@dataclass
class ResumePoint:
    """What a resumed run takes over from the journal."""

    journal: Path
    #: scenario id -> byte offset of its record in the journal (first record per id wins)
    offsets: dict[str, int] = field(default_factory=dict)
    #: records whose id is not in this run's scope (kept in the file, not used)
    ignored: int = 0
    #: True when there was no journal to resume: the run starts fresh
    fresh: bool = False

    @property
    def done(self) -> set[str]:
        return set(self.offsets)


def resume_point(journal: Journal, state: MemevalState) -> ResumePoint:
    """Check ``journal`` against this run and recover its records' offsets.

    A missing or empty journal is a fresh start (``fresh=True``); a journal without a header,
    or with one that differs from this run's, raises :class:`ResumeError`.
    """
    path = journal.path
    point = ResumePoint(journal=path)
    if not path.is_file() or path.stat().st_size == 0:
        point.fresh = True
        return point
    header = journal.read_header()
    if header is None:
        raise ResumeError(
            f"--memeval-resume: {path} has no journal header (written by another version or "
            "damaged); its records cannot be checked against this run. Run without "
            "--memeval-resume to start over."
        )
    diffs = header_differences(header, journal_header(state))
    if diffs:
        raise ResumeError(
            f"--memeval-resume: {path} was written for a different run "
            f"(ckpt {header.get('ckpt')!r}, {header.get('created', '?')}); refusing to mix "
            "results:\n  " + "\n  ".join(diffs) + "\nRun without --memeval-resume to start over."
        )
    scope = set(state.scope_ids)
    try:
        for lineno, offset, record in journal.recover_lines():
            sid = record.get("id")
            if not isinstance(sid, str) or sid not in scope:
                point.ignored += 1
            elif sid not in point.offsets:
                # The record is used as it stands (predictions, metrics): a line that is
                # JSON but not a whole record is refused here, not met as a KeyError later.
                validate_record(record, f"{path}:{lineno}")
                point.offsets[sid] = offset
    except RecordError as exc:
        raise ResumeError(
            f"--memeval-resume: damaged journal record: {exc}\nRepair or remove that line "
            "(its scenario is then evaluated again), or run without --memeval-resume to "
            "start over."
        ) from None
    except ValueError as exc:
        raise ResumeError(f"--memeval-resume: {exc}") from None
    return point


class ResumeSelection:
    """Deselects the items of scenarios a resumed run already has (every process alike)."""

    def __init__(self, done: set[str]) -> None:
        self.done = done

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not self.done:
            return
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            (dropped if scenario_param(item) in self.done else keep).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep


def register_worker_resume(config: pytest.Config) -> None:
    """On an xdist worker: deselect what the controller says the journal already has."""
    wi = workerinput(config)
    if wi is None:
        return
    done = wi.get("memeval_resume_done")
    if done:
        config.pluginmanager.register(ResumeSelection(set(done)), "memeval-resume-selection")
