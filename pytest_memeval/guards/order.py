"""The scenario order of a built variant: its snapshot form and how two orders differ."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pytest_memeval.core.formatting import shown_ids

__all__ = ["describe_order_difference", "join_lines"]


def join_lines(lines: Iterable[str]) -> bytes:
    """``lines`` as LF-terminated UTF-8 bytes (the order snapshot's format)."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def describe_order_difference(expected: Sequence[str], actual: Sequence[str]) -> list[str]:
    """Lines describing how two scenario-id sequences differ (first position, one-sided ids)."""
    lines: list[str] = []
    gone = [i for i in expected if i not in set(actual)]
    new = [i for i in actual if i not in set(expected)]
    if gone:
        lines.append(f"{len(gone)} scenario(s) no longer built: {shown_ids(gone)}")
    if new:
        lines.append(f"{len(new)} scenario(s) newly built: {shown_ids(new)}")
    exp = [i for i in expected if i in set(actual)]
    act = [i for i in actual if i in set(expected)]
    if exp != act:
        k = next(i for i, (a, b) in enumerate(zip(exp, act, strict=False)) if a != b)
        lines.append(
            f"order differs at position {k + 1}: the snapshot has {exp[k]!r}, the build "
            f"{act[k]!r} (snapshot ...{shown_ids(exp[k : k + 4])}; "
            f"build ...{shown_ids(act[k : k + 4])})"
        )
    return lines
