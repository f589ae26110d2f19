"""The run directory: atomic result files and the append-only journal.

Layout of ``runs/<ckpt>/`` (see ``docs/results-schema.md``):

* ``journal.jsonl``: each scenario record as it reaches the controller, flushed and synced;
* ``predictions.jsonl``: one record per scenario, in benchmark order, written atomically;
* ``metrics.json``: the aggregate, written atomically *after* predictions and their recount.

A reader never sees a half-written file: every final file is written to a temporary sibling,
synced, then renamed over the target.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "JOURNAL",
    "METRICS",
    "PREDICTIONS",
    "Journal",
    "atomic_write",
    "read_json",
    "read_predictions",
    "write_json",
]

JOURNAL = "journal.jsonl"
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, chunks: Iterable[str]) -> None:
    """Write ``chunks`` to ``path`` so readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write(path, [json.dumps(data, indent=2, ensure_ascii=False) + "\n"])


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


def read_predictions(path: Path) -> Iterator[dict[str, Any]]:
    """Yield records of a predictions or journal file; a torn last line is an error here."""
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: malformed record ({exc.msg})") from None
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError(f"{path}:{lineno}: not a scenario record")
            yield record


class Journal:
    """Append-only JSONL of records, durable line by line.

    A process killed mid-write leaves at most one torn last line, which :meth:`recover`
    drops; every complete line is a whole record.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = None

    def open(self, *, truncate: bool) -> None:
        self._fh = self.path.open("w" if truncate else "a", encoding="utf-8", newline="\n")

    def append(self, record: Mapping[str, Any]) -> int:
        """Append one record; returns the byte offset where it starts."""
        assert self._fh is not None, "journal not open"
        offset = self._fh.tell()
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return offset

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def recover(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(offset, record)`` for every whole line; truncate a torn tail."""
        if not self.path.exists():
            return
        good_end = 0
        with self.path.open("rb") as fh:
            offset = 0
            for raw in fh:
                try:
                    record = json.loads(raw.decode("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    break
                if not raw.endswith(b"\n") or not isinstance(record, dict):
                    break
                yield offset, record
                offset += len(raw)
                good_end = offset
        if self.path.stat().st_size != good_end:
            with self.path.open("r+b") as fh:
                fh.truncate(good_end)

    def read_at(self, offset: int) -> dict[str, Any]:
        with self.path.open("rb") as fh:
            fh.seek(offset)
            record = json.loads(fh.readline().decode("utf-8"))
        assert isinstance(record, dict)
        return record
