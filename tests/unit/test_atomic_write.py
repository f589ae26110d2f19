"""core.rundir.atomic_write: the package's one atomic writer, for text chunks and bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_memeval.core.rundir import atomic_write


def test_text_chunks_are_written_as_utf8_with_newlines_as_given(tmp_path: Path) -> None:
    target = tmp_path / "new" / "predictions.jsonl"  # the directory is created
    atomic_write(target, ['{"id": "café"}\n', "x\r\n", "y"])
    assert target.read_bytes() == '{"id": "café"}\nx\r\ny'.encode()
    assert [p.name for p in target.parent.iterdir()] == ["predictions.jsonl"]


def test_bytes_are_written_as_they_are(tmp_path: Path) -> None:
    target = tmp_path / "snap.bin"
    data = b"\xef\xbb\xbfno BOM stripping\r\n\x00"
    atomic_write(target, data)
    assert target.read_bytes() == data


def test_the_file_gets_ordinary_permissions(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    old = os.umask(0o022)
    try:
        atomic_write(target, b"{}")
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    atomic_write(target, ["old\n"])

    def chunks() -> Iterator[str]:
        yield "half of the new "
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        atomic_write(target, chunks())
    assert target.read_text("utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
