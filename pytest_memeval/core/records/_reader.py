"""Reading a file of records: each line through :func:`._validate.validate_record`.

:func:`read_records` is the one reader of ``predictions.jsonl`` and ``journal.jsonl``
(recount, results, the gate's baseline, known failures, the step summary): it skips blank
lines and a journal's header and refuses malformed JSON, a line that is not a record and a
scenario seen twice, each as a :class:`._fields.RecordError` naming ``path:line``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pytest_memeval.core.records._fields import RecordError
from pytest_memeval.core.records._types import Record
from pytest_memeval.core.records._validate import validate_record
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY

__all__ = ["read_records"]


def read_records(path: Path) -> Iterator[Record]:
    """Yield the checked records of a ``predictions.jsonl`` or ``journal.jsonl`` file.

    Blank lines and a journal's header line are skipped. A line that is not JSON, not a
    record (:func:`validate_record`), or a second record of the same scenario raises
    :class:`RecordError` naming ``path:line``; ``OSError`` and ``UnicodeDecodeError`` (an
    unreadable file) pass through to the caller.
    """
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(
                    where, None, f"malformed JSON ({exc.msg}, column {exc.colno})"
                ) from None
            if isinstance(obj, dict) and JOURNAL_HEADER_KEY in obj:
                continue
            record = validate_record(obj, where)
            sid = record["id"]
            if sid in first_line:
                raise RecordError(
                    f"{where}: scenario {sid!r}",
                    "id",
                    f"field 'id': the scenario appears twice (first on line {first_line[sid]})",
                    sid,
                )
            first_line[sid] = lineno
            yield record
