"""The run directory: atomic result files and the append-only journal.

The files of one run (see ``docs/results-schema.md``; where each run's files go inside
``runs/<ckpt>/``, the finished run at the top, others in ``subsets/<time>/``, is
:mod:`.runlayout`'s concern):

* ``journal.jsonl``: each scenario record as it reaches the controller, handed to the
  operating system at once and synced to disk in groups (see :class:`Journal`);
* ``predictions.jsonl``: one record per scenario, in benchmark order, written atomically;
* ``metrics.json``: the aggregate, written atomically *after* predictions and their recount.

A reader never sees a half-written file: every final file is written to a temporary sibling,
synced, then renamed over the target.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "JOURNAL",
    "JOURNAL_HEADER_KEY",
    "JOURNAL_PREVIOUS",
    "JOURNAL_SYNC_INTERVAL_S",
    "METRICS",
    "PREDICTIONS",
    "Journal",
    "atomic_write",
    "fsync_dir",
    "read_json",
    "sha256_file",
    "write_json",
]

JOURNAL = "journal.jsonl"
#: Where older versions moved the journal of the run before; a promotion moves it to
#: ``previous/`` with the rest of that run (runlayout.py).
JOURNAL_PREVIOUS = "journal.prev.jsonl"
#: Key that marks a journal's header line (the run's fingerprints); records carry ``id``.
JOURNAL_HEADER_KEY = "memeval_journal"
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"


def fsync_dir(directory: Path) -> None:
    """Sync a directory, so a rename or a new file in it survives a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes (the ``predictions_sha256`` of metrics.json)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, chunks: Iterable[str] | bytes) -> None:
    """Write ``chunks`` (text, UTF-8 encoded, newlines as given) or ``bytes`` to ``path`` so
    that readers see the old file or the whole new one, and the new one survives a crash.

    The one atomic writer of the package: a temporary sibling, synced, renamed over
    ``path``, then the directory synced.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; results are ordinary files, readable as the umask allows.
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            if isinstance(chunks, bytes):
                fh.write(chunks)
            else:
                for chunk in chunks:
                    fh.write(chunk.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write(path, [json.dumps(data, indent=2, ensure_ascii=False) + "\n"])


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


#: At most this long between a record's write and its ``fsync`` (group commit).
JOURNAL_SYNC_INTERVAL_S = 0.5


class Journal:
    """Append-only JSONL of records.

    The first line is a header (``{"memeval_journal": 1, "fingerprints": ...}``) describing
    the run, so a journal alone says what it is a journal of (``--memeval-resume`` checks it).
    A process killed mid-write leaves at most one torn last line, which :meth:`recover`
    drops; every complete line is a whole record.

    Durability, by what can fail: each record is written and flushed to the operating system
    before :meth:`append` returns, so a killed or crashed process (the controller included)
    loses nothing it appended. ``fsync``, which survives a power loss or a kernel crash as
    well, runs for the header at once and then in groups: at the first append at least
    ``sync_interval_s`` after the last sync, and at :meth:`sync` and :meth:`close`, which the
    controller calls before anything is counted from the journal. One ``fsync`` per record
    cost a few milliseconds each here, most of the controller's time on a large benchmark.
    """

    def __init__(self, path: Path, *, sync_interval_s: float = JOURNAL_SYNC_INTERVAL_S) -> None:
        self.path = path
        self.sync_interval_s = sync_interval_s
        self._fh: IO[bytes] | None = None
        self._synced_at = 0.0
        self._unsynced = False

    def open(self, *, truncate: bool, header: Mapping[str, Any] | None = None) -> None:
        """Open for appending (``truncate``: start empty). ``header`` is written first when
        the journal is empty; it must carry :data:`JOURNAL_HEADER_KEY`."""
        # The directory is made here, not in __init__: a run that never opens its journal
        # (it evaluated nothing) leaves no directory behind.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Binary mode: tell() is then a plain byte offset, the one read_at() seeks to.
        self._fh = self.path.open("wb" if truncate else "ab")
        if header is not None and self._fh.tell() == 0:
            assert JOURNAL_HEADER_KEY in header
            self._write(header)
            self.sync()
            fsync_dir(self.path.parent)

    @property
    def is_open(self) -> bool:
        return self._fh is not None

    def _write(self, data: Mapping[str, Any]) -> int:
        assert self._fh is not None, "journal not open"
        offset = self._fh.tell()
        self._fh.write((json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8"))
        self._fh.flush()
        self._unsynced = True
        return offset

    def append(self, record: Mapping[str, Any]) -> int:
        """Append one record (flushed to the operating system; synced to disk within the
        sync interval); returns the byte offset where it starts."""
        offset = self._write(record)
        if time.monotonic() - self._synced_at >= self.sync_interval_s:
            self.sync()
        return offset

    def sync(self) -> None:
        """``fsync`` what was appended and not synced yet."""
        if self._fh is not None and self._unsynced:
            os.fsync(self._fh.fileno())
            self._unsynced = False
        self._synced_at = time.monotonic()

    def read_header(self) -> dict[str, Any] | None:
        """The header line, or ``None`` for a missing/empty journal or one without header."""
        if not self.path.is_file():
            return None
        with self.path.open("rb") as fh:
            first = fh.readline()
        try:
            data = json.loads(first.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) and JOURNAL_HEADER_KEY in data else None

    def close(self) -> None:
        """Sync what is not synced yet, then close."""
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None

    def recover(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(offset, record)`` for every whole record line; truncate a torn tail.

        Only the *last* line can be torn (each append is flushed whole before the next); an
        unreadable line with good lines after it means the file was damaged otherwise, and is
        an error rather than a reason to drop the records after it.
        """
        for _lineno, offset, record in self.recover_lines():
            yield offset, record

    def recover_lines(self) -> Iterator[tuple[int, int, dict[str, Any]]]:
        """:meth:`recover`, with each record's 1-based line number first (for messages that
        name ``journal:line``). The torn tail is truncated only once every line was read."""
        if not self.path.exists():
            return
        good_end = 0
        torn_at: int | None = None
        with self.path.open("rb") as fh:
            offset = 0
            for lineno, raw in enumerate(fh, start=1):
                if torn_at is not None:
                    if raw.strip():
                        raise ValueError(
                            f"{self.path}:{torn_at}: damaged journal line followed by more "
                            "records; not truncating (repair or move the file)"
                        )
                    continue
                try:
                    record = json.loads(raw.decode("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    record = None
                if not raw.endswith(b"\n") or not isinstance(record, dict):
                    torn_at = lineno
                    continue
                if JOURNAL_HEADER_KEY not in record:
                    yield lineno, offset, record
                offset += len(raw)
                good_end = offset
        if self.path.stat().st_size != good_end:
            with self.path.open("r+b") as fh:
                fh.truncate(good_end)

    def read_at(self, offsets: Iterable[int]) -> Iterator[dict[str, Any]]:
        """The records starting at ``offsets``, in that order, through one open file."""
        with self.path.open("rb") as fh:
            for offset in offsets:
                fh.seek(offset)
                record = json.loads(fh.readline().decode("utf-8"))
                assert isinstance(record, dict)
                yield record
