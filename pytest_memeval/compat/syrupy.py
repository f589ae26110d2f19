"""syrupy internals for the byte-exact snapshot extensions (``guards/snapshot.py``).

Checked on syrupy 7.0.2 (installed, the newest release; Python 3.11+) and 6.1.1 (what
Python 3.10 gets): ``SingleFileSnapshotExtension._write_mode`` and ``WriteMode`` exist in both
(and since 4.0); ``_sanitize_filename`` and ``_max_stem_length`` only in 7.x, which is also the
only version that asks an extension ``matches_test_location`` (the one caller of
:func:`snapshot_file_name`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from pytest_memeval.compat import installed_version

__all__ = ["binary_file_extension", "disable_unused_snapshot_check", "snapshot_file_name"]

E = TypeVar("E", bound=type[SingleFileSnapshotExtension])


def binary_file_extension(cls: E) -> E:
    """Class decorator: make the single-file extension ``cls`` read and write its files in
    binary mode (bytes in, the same bytes on disk). Raises ``TypeError`` on a syrupy without
    the private switch, rather than letting it write text (normalised line endings)."""
    # private: SingleFileSnapshotExtension._write_mode = WriteMode.BINARY (syrupy 4.0-7.0.2;
    # BINARY is also its default there, set here so that a changed default cannot bite).
    if not hasattr(SingleFileSnapshotExtension, "_write_mode") or not hasattr(WriteMode, "BINARY"):
        raise TypeError(
            f"pytest-memeval: the installed syrupy {installed_version('syrupy')} has no "
            "SingleFileSnapshotExtension._write_mode/WriteMode.BINARY, which the byte guards "
            "need to store exact bytes (checked on syrupy 6.1.1 and 7.0.2)"
        )
    cls._write_mode = WriteMode.BINARY
    return cls


def snapshot_file_name(
    extension: type[SingleFileSnapshotExtension], nodename: str, file_extension: str
) -> str | None:
    """The file name syrupy's single-file layout gives the snapshot of item ``nodename``
    (sanitised, cut to syrupy's stem budget), or ``None`` when this syrupy does not expose how
    it builds that name (the caller then leaves the whole decision to syrupy)."""
    # private: SingleFileSnapshotExtension._sanitize_filename(name) and
    # ._max_stem_length() (classmethods; syrupy 7.0.0-7.0.2, absent in 6.1.1).
    sanitize: Any = getattr(extension, "_sanitize_filename", None)
    max_stem: Any = getattr(extension, "_max_stem_length", None)
    if not callable(sanitize) or not callable(max_stem):
        return None
    stem = str(sanitize(nodename))[: int(max_stem())]
    return f"{stem}.{file_extension}" if file_extension else stem


def disable_unused_snapshot_check(config: pytest.Config) -> bool:
    """Turn syrupy's unused-snapshot detection off, as ``--snapshot-disable-unused`` does;
    ``False`` when syrupy is not active (it has not added its options)."""
    # undocumented: the option's dest, config.option.disable_unused_snapshots (6.1.1, 7.0.2).
    if not hasattr(config.option, "disable_unused_snapshots"):
        return False
    config.option.disable_unused_snapshots = True
    return True
