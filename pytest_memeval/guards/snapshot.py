"""Byte-exact syrupy snapshot extensions for the byte guards.

syrupy's default (amber) serialiser normalises line endings and quotes data, so it cannot
prove that a byte did not move. These extensions store exactly the bytes they are given, one
file per snapshot (a failure points at one scenario, and updating one snapshot cannot corrupt
another), write each file atomically, and explain a mismatch in the guard's own terms rather
than as a wall of bytes.

Use them with syrupy's ``snapshot`` fixture::

    assert snapshot(extension_class=RecordSnapshot) == line_bytes
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from syrupy.data import SnapshotCollection
from syrupy.extensions.single_file import SingleFileSnapshotExtension

from pytest_memeval.compat.syrupy import binary_file_extension, snapshot_file_name
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.guards.differences import (
    describe_byte_difference,
    describe_record_difference,
)
from pytest_memeval.guards.order import describe_order_difference
from pytest_memeval.guards.tokens import describe_token_difference

__all__ = ["ByteSnapshot", "OrderSnapshot", "RecordSnapshot", "TokenSnapshot"]

_MISSING = (
    "no snapshot is recorded for this item yet; record it with --snapshot-update "
    "(then review and commit the new file)"
)


@binary_file_extension
class ByteSnapshot(SingleFileSnapshotExtension):
    """Bytes in, the same bytes on disk: binary mode, no normalisation, atomic writes."""

    file_extension = "raw"

    def serialize(self, data: Any, **kwargs: Any) -> bytes:
        # Only bytes: a str would have to be encoded here, and the guard must choose how.
        if not isinstance(data, bytes):
            raise TypeError(f"{type(self).__name__} stores bytes, got {type(data).__name__}")
        return data

    @classmethod
    def write_snapshot_collection(
        cls, *, snapshot_collection: SnapshotCollection, name_order: dict[str, int] | None = None
    ) -> None:
        location = Path(snapshot_collection.location)
        data = next(iter(snapshot_collection)).data
        if not isinstance(data, bytes):
            raise TypeError(f"{cls.__name__} writes bytes, got {type(data).__name__}")
        # The package's one atomic writer: an interrupted update leaves the old snapshot,
        # never a truncated one.
        atomic_write(location, data)

    @classmethod
    def matches_test_location(cls, *, test_location: Any, snapshot_location: str) -> bool:
        # syrupy's unused-snapshot report asks this for every (snapshot file, item) pair of a
        # module, resolving paths each time: with one file per scenario that is quadratic and
        # took most of the run. A file this extension wrote is named exactly by the item, so
        # compare names first and leave the full check to syrupy for the one candidate left
        # (all of it, where syrupy does not expose how it names files: expected is None).
        nodename = test_location.nodename
        if nodename is not None and test_location.classname is None:
            expected = _file_name(cls, nodename, cls.file_extension)
            if expected is not None and os.path.basename(snapshot_location) != expected:
                return False
        return bool(
            super().matches_test_location(
                test_location=test_location, snapshot_location=snapshot_location
            )
        )

    def describe(self, snapshot: bytes, now: bytes) -> list[str]:
        """How ``now`` differs from the stored ``snapshot`` (override for a domain view)."""
        return describe_byte_difference(
            snapshot, now, expected_label="snapshot", actual_label="now"
        )

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        if not isinstance(snapshot_data, bytes) or not snapshot_data:
            yield _MISSING
            return
        yield from self.describe(snapshot_data, bytes(serialized_data))


@lru_cache(maxsize=65536)
def _file_name(cls: type[ByteSnapshot], nodename: str, extension: str) -> str | None:
    """The file name syrupy's single-file layout gives the snapshot of item ``nodename``
    (cached: asked once per snapshot file and item of a module)."""
    return snapshot_file_name(cls, nodename, extension)


class RecordSnapshot(ByteSnapshot):
    """One built record, as its training-format JSONL line."""

    file_extension = "jsonl"

    def describe(self, snapshot: bytes, now: bytes) -> list[str]:
        return describe_record_difference(
            snapshot, now, expected_label="snapshot", actual_label="now"
        )


class OrderSnapshot(ByteSnapshot):
    """The scenario ids of a built variant, one a line, in build order."""

    file_extension = "ids"

    def describe(self, snapshot: bytes, now: bytes) -> list[str]:
        old = snapshot.decode("utf-8", "replace").splitlines()
        new = now.decode("utf-8", "replace").splitlines()
        return describe_order_difference(old, new) or super().describe(snapshot, now)


class TokenSnapshot(ByteSnapshot):
    """A scenario's prompt token ids (:func:`pytest_memeval.guards.tokens.serialize_tokens`)."""

    file_extension = "tokens"

    def describe(self, snapshot: bytes, now: bytes) -> list[str]:
        return describe_token_difference(snapshot, now)
