"""How two byte strings, or two JSONL record lines, first differ: readable failure lines.

:func:`describe_byte_difference` names the first differing byte offset with a short context
on both sides and a caret under it; :func:`describe_record_difference` first says which
message (or field) of two records differs. The reference checks and the byte-exact snapshot
extensions word their failures with these.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = [
    "CONTEXT",
    "describe_byte_difference",
    "describe_record_difference",
    "first_difference",
]

#: Bytes of context shown on each side of a first difference.
CONTEXT = 24


def first_difference(a: bytes, b: bytes) -> int | None:
    """Offset of the first byte where ``a`` and ``b`` differ (or where one ends); ``None``
    when they are equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _show(data: bytes) -> str:
    """Bytes as readable text: UTF-8 decoded, line ends and tabs made visible."""
    text = data.decode("utf-8", "backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


class _Window(NamedTuple):
    """The shown text on each side of an offset."""

    before: str
    after: str


class _Position(NamedTuple):
    """An offset as a 1-based line and column."""

    line: int
    col: int


def _window(data: bytes, offset: int, width: int) -> _Window:
    """The shown text around ``offset``, cut at UTF-8 character bounds."""
    start = max(0, offset - width)
    while 0 < start < offset and _is_continuation(data[start]):
        start += 1
    end = min(len(data), offset + width)
    while offset < end < len(data) and _is_continuation(data[end]):
        end -= 1
    before = ("…" if start > 0 else "") + _show(data[start:offset])
    after = _show(data[offset:end]) + ("…" if end < len(data) else "")
    return _Window(before, after)


def _line_col(data: bytes, offset: int) -> _Position:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return _Position(line, col)


def describe_byte_difference(
    expected: bytes,
    actual: bytes,
    *,
    expected_label: str = "expected",
    actual_label: str = "actual",
    width: int = CONTEXT,
    unit: str = "",
) -> list[str]:
    """Lines naming the first differing byte offset, with ``width`` bytes of context on both
    sides and a caret under the difference. ``unit`` names what the offset counts in."""
    offset = first_difference(expected, actual)
    if offset is None:
        return []
    at = _line_col(expected, offset)
    where = f"first differing byte at offset {offset}"
    if unit:
        where += f" of {unit}"
    if expected.count(b"\n", 0, len(expected) - 1) or actual.count(b"\n", 0, len(actual) - 1):
        where += f" (line {at.line}, column {at.col})"
    if offset >= len(expected) or offset >= len(actual):
        shorter = expected_label if offset >= len(expected) else actual_label
        where += f"; the {shorter} ends there ({len(expected)} vs {len(actual)} bytes)"
    pad = max(len(expected_label), len(actual_label))
    lines = [where]
    caret_at = 0
    for label, data in ((expected_label, expected), (actual_label, actual)):
        shown = _window(data, offset, width)
        lines.append(f"  {label.ljust(pad)}: {shown.before}{shown.after or '<end>'}")
        caret_at = max(caret_at, len(shown.before))
    lines.append("  " + " " * (pad + 2 + caret_at) + "^")
    return lines


def _locate(expected: Any, actual: Any) -> str:
    """Where two decoded records first differ, in record terms (message index, field)."""
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return "the line is not a JSON object on one side"
    if expected.get("id") != actual.get("id"):
        return f"field 'id' differs ({expected.get('id')!r} vs {actual.get('id')!r})"
    em, am = expected.get("messages"), actual.get("messages")
    if isinstance(em, list) and isinstance(am, list):
        for i, (e, a) in enumerate(zip(em, am, strict=False)):
            if e != a:
                role = e.get("role") if isinstance(e, dict) else None
                other = a.get("role") if isinstance(a, dict) else None
                roles = f"{role}" if role == other else f"{role} vs {other}"
                return f"messages[{i}] ({roles}) differs"
        if len(em) != len(am):
            return (
                f"the message count differs ({len(em)} vs {len(am)}); first unmatched is "
                f"messages[{min(len(em), len(am))}]"
            )
    elif em != am:
        return "field 'messages' differs"
    ec, ac = expected.get("memory_chain"), actual.get("memory_chain")
    if ec != ac:
        if isinstance(ec, list) and isinstance(ac, list):
            for i, (e, a) in enumerate(zip(ec, ac, strict=False)):
                if e != a:
                    return f"memory_chain[{i}] differs"
            return f"memory_chain length differs ({len(ec)} vs {len(ac)})"
        return "field 'memory_chain' differs"
    if set(expected) != set(actual):
        return f"fields differ ({sorted(expected)} vs {sorted(actual)})"
    if list(expected) != list(actual):
        return f"key order differs ({list(expected)} vs {list(actual)})"
    return "same JSON values, different serialisation (escaping, spacing or line end)"


def describe_record_difference(
    expected: bytes,
    actual: bytes,
    *,
    expected_label: str = "expected",
    actual_label: str = "actual",
) -> list[str]:
    """A record-level description of two differing JSONL lines: which message (or field)
    differs, then the first differing byte offset and its context."""
    try:
        located = _locate(json.loads(expected), json.loads(actual))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        located = f"a line is not valid JSON ({exc})"
    return [
        located,
        *describe_byte_difference(
            expected,
            actual,
            expected_label=expected_label,
            actual_label=actual_label,
            unit="the line",
        ),
    ]
