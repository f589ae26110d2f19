"""The cache directory: what pytest-memeval derives once and every later run reuses.

Where it is (the first that is set wins):

1. ``--memeval-cache-dir DIR`` (relative to where pytest was started), or ``--cache-dir`` of
   ``memeval fetch`` / ``memeval bench``;
2. the ini key ``memeval_cache_dir`` (relative to the rootdir);
3. the environment variable ``MEMEVAL_CACHE_DIR``;
4. ``$XDG_CACHE_HOME/pytest-memeval``;
5. ``~/.cache/pytest-memeval``.

One folder per kind of entry (:data:`KINDS`)::

    <cache>/gguf/<sha256 of the .gguf file>/   safetensors conversion of a GGUF checkpoint
    <cache>/downloads/<package>-<version>/     files fetched from a package registry
    <cache>/calibration/<sha256 of its key>.json  the fast decoder's measured calibration

Every entry is produced once, by :func:`produce_once`: the producer holds ``<entry>.lock``
(an exclusive ``flock``: a second process, an xdist worker or a concurrent run, waits for it
instead of producing the entry again), builds the entry in a hidden temporary sibling and
renames it into place, so a reader sees no entry or a whole one, never a half-written one. A
producer killed half-way leaves only its temporary sibling, which the next producer removes.
Deleting the cache directory (or any entry in it) is always safe between runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pytest_memeval.core.rundir import fsync_dir

if sys.platform != "win32":
    import fcntl

__all__ = [
    "APP_NAME",
    "ENV_VAR",
    "KINDS",
    "cache_entry",
    "produce_once",
    "resolve_cache_dir",
]

APP_NAME = "pytest-memeval"
ENV_VAR = "MEMEVAL_CACHE_DIR"
#: The kinds of entries, one folder each (docs/profiles.md, "The cache directory").
KINDS = ("gguf", "downloads", "calibration")

_TMP_MARK = ".tmp-"


def resolve_cache_dir(
    explicit: Path | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """The cache directory: ``explicit`` (an option or ini value, already made absolute by
    the caller), else ``MEMEVAL_CACHE_DIR``, ``$XDG_CACHE_HOME/pytest-memeval``,
    ``~/.cache/pytest-memeval``. Absolute; not created here."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit.expanduser().resolve()
    if env.get(ENV_VAR):
        return Path(env[ENV_VAR]).expanduser().resolve()
    if env.get("XDG_CACHE_HOME"):
        return (Path(env["XDG_CACHE_HOME"]).expanduser() / APP_NAME).resolve()
    return (Path.home() / ".cache" / APP_NAME).resolve()


def cache_entry(root: Path, kind: str, name: str) -> Path:
    """``<root>/<kind>/<name>``: where an entry of ``kind`` lives (not created here)."""
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r} (known: {', '.join(KINDS)})")
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise ValueError(f"cache entry name {name!r} must be a plain, visible file name")
    return root / kind / name


@contextlib.contextmanager
def _locked(lock_path: Path, on_wait: Callable[[], None] | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if absent) for the block."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if sys.platform != "win32":
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
        # Windows: no flock; the atomic rename below still keeps readers from a half entry.
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _sync_tree(path: Path) -> None:
    """Flush a new entry to disk before it is renamed into place (a crash then leaves a
    whole entry or none)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if path.is_dir():
        fsync_dir(path)


def produce_once(
    target: Path,
    build: Callable[[Path], None],
    *,
    on_wait: Callable[[], None] | None = None,
    accept: Callable[[Path], bool] | None = None,
) -> bool:
    """Make ``target`` (a file or a directory) exist, built by ``build`` at most once.

    ``build(tmp)`` must create ``tmp`` (a file or a directory) completely; it is then
    renamed to ``target``. Returns ``True`` when this call built it, ``False`` when it was
    there already (or another process put it there meanwhile). ``on_wait`` is called once if
    another process holds the entry's lock (it is building the same entry): this call then
    waits for it and uses its result. An exception from ``build`` propagates, and nothing of
    that attempt is left behind.

    ``accept(target)``, when given, decides whether an entry already there is usable (e.g.
    it parses and is what was asked for); one it rejects is built again, under the lock, so
    that two processes finding the same bad entry replace it once, not once each.
    """

    def usable() -> bool:
        return target.exists() and (accept is None or accept(target))

    if usable():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock"), on_wait):
        if usable():  # built by the process we waited for
            return False
        # Holding the lock, nobody else builds this entry: any temporary sibling of it is
        # what a killed producer left.
        for stale in target.parent.glob(f".{target.name}{_TMP_MARK}*"):
            _remove(stale)
        tmp = target.with_name(f".{target.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            build(tmp)
            if not tmp.exists():
                raise RuntimeError(f"building {target} created nothing at {tmp}")
            _sync_tree(tmp)
            if target.is_dir() and not target.is_symlink():
                # A rejected directory entry (``accept``): rename cannot replace a non-empty
                # directory. A rejected file is replaced by the rename itself, atomically.
                _remove(target)
            try:
                os.rename(tmp, target)
            except OSError:
                # A process that could not take the lock (a file system without flock)
                # renamed its own whole copy into place first: that one stands.
                if not target.exists():
                    raise
                return False
            fsync_dir(target.parent)
        finally:
            if tmp.exists():
                _remove(tmp)
    return True
