"""The reference contract: the built records equal the training-format file, byte for byte.

The records the harness builds for a data variant, serialised with
:func:`~pytest_memeval.core.benchmark.dump_record`, must equal that variant's training-format
file. :func:`read_reference` keeps the file as raw bytes split into lines;
:func:`check_reference_line` compares one scenario's line, :func:`check_reference_file` the
whole file (framing, scenario set, order). A difference names the scenario, the message
index, the first differing byte offset and a short context on both sides.
"""

from __future__ import annotations

import codecs
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.guards.differences import (
    describe_byte_difference,
    describe_record_difference,
)
from pytest_memeval.guards.specs import GuardError

__all__ = [
    "ReferenceFile",
    "ReferenceLine",
    "check_reference_file",
    "check_reference_line",
    "read_reference",
]


@dataclass(frozen=True)
class ReferenceLine:
    """One line of a reference file: its number, its bytes (with the line end) and id."""

    lineno: int
    data: bytes
    id: str | None
    error: str | None = None


@dataclass(frozen=True)
class ReferenceFile:
    """A training-format reference file, kept as raw bytes and split into lines."""

    path: Path
    raw: bytes
    lines: tuple[ReferenceLine, ...]
    #: how messages name the file (e.g. relative to the project root)
    name: str = ""

    def __str__(self) -> str:
        return self.name or str(self.path)

    def by_id(self) -> dict[str, ReferenceLine]:
        out: dict[str, ReferenceLine] = {}
        for line in self.lines:
            if line.id is not None:
                out.setdefault(line.id, line)
        return out


def read_reference(path: Path, name: str = "") -> ReferenceFile:
    """Read a training-format JSONL file as bytes; ``GuardError`` if it cannot be read.

    ``name`` is how failure messages call the file (default: ``path``).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GuardError(f"{path}: reference file not found") from None
    except OSError as exc:
        raise GuardError(f"{path}: cannot read reference file ({exc.strerror})") from None
    lines = [
        _reference_line(lineno, data)
        for lineno, data in enumerate(raw.splitlines(keepends=True), start=1)
    ]
    return ReferenceFile(path, raw, tuple(lines), name)


def _reference_line(lineno: int, data: bytes) -> ReferenceLine:
    """Line ``lineno`` (``data``, with its line end): its scenario id, or why it has none."""
    text = data.rstrip(b"\r\n")
    sid: str | None = None
    error: str | None = None
    if lineno == 1 and text.startswith(codecs.BOM_UTF8):
        text = text[len(codecs.BOM_UTF8) :]
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        error = f"not a JSON record ({exc})" if text.strip() else "blank line"
    else:
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            sid = obj["id"]
        else:
            error = "not a record with a string 'id'"
    return ReferenceLine(lineno, data, sid, error)


def check_reference_line(
    variant: str, scenario_id: str, built: bytes, reference: ReferenceFile
) -> str | None:
    """Compare one built record line with the reference line of the same scenario id.

    Returns ``None`` when they are byte-identical, else a readable failure message.
    """
    ref = reference.by_id().get(scenario_id)
    if ref is None:
        return (
            f"{variant} scenario {scenario_id!r}: built by the harness but absent from the "
            f"reference {reference}"
        )
    if ref.data == built:
        return None
    head = (
        f"{variant} scenario {scenario_id!r}: the built record differs from the reference "
        f"{reference}:{ref.lineno}"
    )
    lines = describe_record_difference(
        ref.data, built, expected_label="reference", actual_label="built"
    )
    return "\n".join([head, *("  " + line for line in lines)])


def check_reference_file(
    variant: str, built: Sequence[tuple[str, bytes]], reference: ReferenceFile
) -> str | None:
    """Compare the whole built variant (``(id, line)`` in order) with the reference file.

    Checks what the per-scenario comparison cannot see: line framing (BOM, CRLF, final
    newline, blank lines), scenarios only on one side, duplicates and order. Returns ``None``
    when the files are byte-identical, else a readable message (one problem per line).
    """
    joined = b"".join(line for _, line in built)
    if joined == reference.raw:
        return None
    path = str(reference)
    problems = [
        *_framing_problems(reference),
        *_scenario_set_problems(built, reference),
        *_content_problems(variant, built, reference),
    ]
    if not problems:
        # Only reachable for framing the checks above do not name; show the raw offset.
        problems.extend(
            describe_byte_difference(
                reference.raw,
                joined,
                expected_label="reference",
                actual_label="built",
                unit="the file",
            )
        )
    head = f"{variant}: the built records differ from the training-format reference {path}"
    return "\n".join([head, *("  " + p for p in problems)])


def _framing_problems(reference: ReferenceFile) -> list[str]:
    """How the file's framing departs from the training format: BOM, CRLF, final newline, and
    lines that are not records."""
    path = str(reference)
    problems: list[str] = []
    if reference.raw.startswith(codecs.BOM_UTF8):
        problems.append(f"{path}:1: starts with a UTF-8 byte-order mark; the build writes none")
    crlf = [ln.lineno for ln in reference.lines if ln.data.endswith(b"\r\n")]
    if crlf:
        problems.append(
            f"{path}: {len(crlf)} line(s) end with CRLF (first: line {crlf[0]}); the training "
            "format ends lines with LF only"
        )
    if reference.raw and not reference.raw.endswith(b"\n"):
        problems.append(f"{path}:{len(reference.lines)}: the last line has no final newline")
    for ln in reference.lines:
        if ln.error is not None:
            problems.append(f"{path}:{ln.lineno}: {ln.error}")
    return problems


def _scenario_set_problems(
    built: Sequence[tuple[str, bytes]], reference: ReferenceFile
) -> list[str]:
    """Duplicate ids in the file, scenarios only on one side, and the first order difference
    of the scenarios on both."""
    path = str(reference)
    problems: list[str] = []
    ref_ids = [ln.id for ln in reference.lines if ln.id is not None]
    dups = [i for i, n in Counter(ref_ids).items() if n > 1]
    if dups:
        problems.append(f"{path}: duplicate scenario id(s) {shown_ids(dups)}")
    built_ids = [sid for sid, _ in built]
    only_ref = [i for i in dict.fromkeys(ref_ids) if i not in set(built_ids)]
    only_built = [i for i in built_ids if i not in set(ref_ids)]
    if only_ref:
        problems.append(f"{len(only_ref)} scenario(s) only in the reference: {shown_ids(only_ref)}")
    if only_built:
        problems.append(f"{len(only_built)} scenario(s) only in the build: {shown_ids(only_built)}")
    common = set(ref_ids) & set(built_ids)
    ref_order = [i for i in dict.fromkeys(ref_ids) if i in common]
    built_order = [i for i in built_ids if i in common]
    if ref_order != built_order:
        k = next(i for i, (a, b) in enumerate(zip(ref_order, built_order, strict=False)) if a != b)
        lineno = reference.by_id()[ref_order[k]].lineno
        problems.append(
            f"scenario order differs: {path}:{lineno} holds {ref_order[k]!r} where the build has "
            f"{built_order[k]!r} (reference order ...{shown_ids(ref_order[k : k + 4])}; "
            f"build order ...{shown_ids(built_order[k : k + 4])})"
        )
    return problems


def _content_problems(
    variant: str, built: Sequence[tuple[str, bytes]], reference: ReferenceFile
) -> list[str]:
    """The scenarios on both sides whose lines differ, with the first one's difference."""
    by_id = reference.by_id()
    differing = [(sid, data) for sid, data in built if sid in by_id and by_id[sid].data != data]
    if not differing:
        return []
    ids = [sid for sid, _ in differing]
    problems = [f"{len(differing)} scenario(s) differ byte-wise: {shown_ids(ids)}; first:"]
    sid, data = differing[0]
    detail = check_reference_line(variant, sid, data, reference)
    if detail:
        problems.extend("  " + line for line in detail.splitlines())
    return problems
