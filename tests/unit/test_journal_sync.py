"""The journal's durability in groups: every record reaches the operating system when it is
appended (a killed process loses nothing), ``fsync`` runs at most once per sync interval and
always before the journal is closed and read for the metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY, Journal

HEADER = {JOURNAL_HEADER_KEY: 1, "fingerprints": {}}


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The real ``os.fsync``, counted."""
    calls: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return calls


def test_records_are_readable_at_once_and_synced_in_groups(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    journal = Journal(tmp_path / "journal.jsonl", sync_interval_s=3600)
    journal.open(truncate=True, header=HEADER)
    assert len(fsyncs) == 2  # the header and its directory entry, at once
    del fsyncs[:]
    offsets = [journal.append({"id": f"s{k}"}) for k in range(200)]
    # Another process (resume, a person with tail -f) reads every record now.
    lines = (tmp_path / "journal.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(x)["id"] for x in lines[1:]] == [f"s{k}" for k in range(200)]
    assert fsyncs == []  # but 200 appends within the interval synced nothing
    journal.close()
    assert len(fsyncs) == 1  # close syncs the rest, before anyone counts from the file
    again = Journal(tmp_path / "journal.jsonl")
    assert [offset for offset, _ in again.recover()] == offsets


def test_an_interval_of_zero_syncs_every_record(tmp_path: Path, fsyncs: list[int]) -> None:
    journal = Journal(tmp_path / "journal.jsonl", sync_interval_s=0)
    journal.open(truncate=True, header=HEADER)
    del fsyncs[:]
    for k in range(5):
        journal.append({"id": f"s{k}"})
    assert len(fsyncs) == 5
    journal.close()
    assert len(fsyncs) == 5  # nothing left to sync


def test_sync_after_the_interval(tmp_path: Path, fsyncs: list[int]) -> None:
    journal = Journal(tmp_path / "journal.jsonl", sync_interval_s=3600)
    journal.open(truncate=True, header=HEADER)
    del fsyncs[:]
    journal.append({"id": "s0"})
    assert fsyncs == []
    journal._synced_at -= 3600  # the interval has passed
    journal.append({"id": "s1"})
    assert len(fsyncs) == 1
    journal.close()
