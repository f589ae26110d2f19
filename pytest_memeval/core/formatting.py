"""How numbers and lists read in messages: one wording, one limit, everywhere.

Every message that names scenarios (refusals, warnings, summaries) shows at most
:data:`SHOWN` of them and says how many it left out, the same way; every throughput reads
``0.84 scenarios/s``; every rate of right answers reads ``167/189 = 88.36%``. Plain
functions over plain values: nothing here knows about runs, records or pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ELLIPSIS",
    "SHOWN",
    "columns",
    "counts_text",
    "per_second",
    "percent",
    "score_text",
    "shorten",
    "shown_ids",
    "shown_list",
]

#: The most items (scenario ids, problems) a message lists before "and N more": enough to
#: recognise a pattern, few enough that the message stays readable in a terminal.
SHOWN = 10
#: What :func:`shorten` puts where it cut a value: one character, so a limit is the width.
ELLIPSIS = "…"


def shown_list(items: Iterable[str], limit: int = SHOWN, *, sep: str = ", ") -> str:
    """``a, b, c``, or the first ``limit`` items and ``, and 5 more``; ``none`` if empty.

    Items are shown as given: format them first (``repr`` for ids, which may hold spaces or
    commas; ``'s1' (876 tokens)`` for an id with a detail). ``sep`` joins them (``"; "`` for
    items that are sentences).
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    listed = list(items)
    if not listed:
        return "none"
    text = sep.join(listed[:limit])
    left = len(listed) - limit
    return text + (f"{sep}and {left} more" if left > 0 else "")


def shown_ids(ids: Iterable[str], limit: int = SHOWN) -> str:
    """Scenario ids as :func:`shown_list` shows them, each as its ``repr``: ``'s1', 'a b'``
    (an id may hold spaces or commas, so the quotes say where each ends)."""
    return shown_list((repr(i) for i in ids), limit)


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and
    :data:`ELLIPSIS`: a value (a ``repr``, a JSON fragment) cut to fit one message line."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def per_second(rate: float, unit: str = "scenarios") -> str:
    """A throughput: ``0.84 scenarios/s`` (two decimals, whatever the magnitude)."""
    return f"{rate:.2f} {unit}/s"


def percent(fraction: float, decimals: int = 2) -> str:
    """A fraction as a percentage: ``0.8836`` -> ``88.36%``.

    Two decimals for a rate of right answers (metrics.json's precision); ``decimals=1`` for
    a share that only says "about how much" (progress, hand-offs, discordant scenarios).
    """
    return f"{fraction * 100:.{decimals}f}%"


def score_text(correct: int, total: int, rate: float | None) -> str:
    """A rate of right answers with its counts: ``167/189 = 88.36%``, or ``0/0 = n/a`` when
    there is nothing to score (``rate`` is ``None``)."""
    return f"{correct}/{total} = {'n/a' if rate is None else percent(rate)}"


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as aligned text columns (two spaces apart, trailing spaces cut)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def counts_text(counts: Mapping[str, Any]) -> str:
    """A run's counts on one line, as ``memeval merge`` and ``memeval recount`` print them:
    ``n=189 m1=127/189 m2=188/415 unaligned=161 parse_fail=0``."""
    m1, m2 = counts["m1"], counts["m2"]
    return (
        f"n={counts['n']} m1={m1['correct']}/{m1['total']} m2={m2['correct']}/{m2['total']} "
        f"unaligned={counts['unaligned']} parse_fail={counts['parse_fail']}"
    )
