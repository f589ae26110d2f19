"""Slices: which scenarios a slice holds, how a user names slices, how a run's slices read.

A slice is the scenarios that carry a tag (:mod:`pytest_memeval.core.tags`), or, named
``TAG&TAG``, every one of several tags. ``metrics.json`` holds one block per tag
(``slices``, counted by :class:`~pytest_memeval.core.metrics.Tally` and recounted by
:mod:`pytest_memeval.core.recount`); ``memeval compare --slice``, the per-slice gates and the
summaries name slices with the expressions parsed here.

Two runs of the same scenarios can tag them differently (the baseline variant of the demo
cannot know which door subtasks the oracle variant dropped): a scenario is then in a slice
when *either* run's record carries the tag (:func:`merged_tags`), and the comparison says on
how many scenarios the runs' tags differ.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_memeval.core.formatting import columns, percent, score_text, shown_list
from pytest_memeval.core.records import RateBlock, Record, SliceBlock
from pytest_memeval.core.stats import METHOD_WORDS
from pytest_memeval.core.tags import tag_problem

__all__ = [
    "GLOB_CHARS",
    "SliceError",
    "SliceSpec",
    "merged_tags",
    "parse_slice",
    "select_slices",
    "slice_table",
]

#: Characters that make a slice pattern a glob (``query:*``); no tag holds them.
GLOB_CHARS = "*?["


class SliceError(ValueError):
    """A slice expression that names no slice of the runs; the message says which exist."""


@dataclass(frozen=True)
class SliceSpec:
    """One slice to show or gate: the scenarios that carry every tag of ``tags``."""

    tags: tuple[str, ...]

    @property
    def name(self) -> str:
        """The slice as written: its tag, or its tags joined by ``&``."""
        return "&".join(self.tags)

    def holds(self, tags: Collection[str]) -> bool:
        """Whether a scenario with these tags is in the slice."""
        return all(tag in tags for tag in self.tags)


def merged_tags(*records: Record) -> frozenset[str]:
    """A scenario's tags over the runs compared: a tag of any of its records counts."""
    return frozenset(tag for record in records for tag in record.get("tags", ()))


def _known_words(known: Sequence[str]) -> str:
    return shown_list(known, 12) if known else "none (no scenario has tags)"


def parse_slice(expression: str, known: Sequence[str]) -> list[SliceSpec]:
    """The slices one expression names, against the ``known`` tags (in slice order).

    ``TAG`` names one slice; a glob (``query:*``, with ``*``, ``?`` or ``[``) every tag it
    matches; ``TAG&TAG...`` the scenarios that carry all of those tags (exact tags only).
    Raises :class:`SliceError` for a tag no scenario carries, a glob that matches none, or a
    malformed expression.
    """
    text = expression.strip()
    parts = [part.strip() for part in text.split("&")]
    if not text or any(not part for part in parts):
        raise SliceError(f"slice {expression!r}: empty (write a tag, 'key:*', or 'tag&tag')")
    if len(parts) == 1 and any(ch in text for ch in GLOB_CHARS):
        matched = [tag for tag in known if fnmatch.fnmatchcase(tag, text)]
        if not matched:
            raise SliceError(
                f"slice {expression!r} matches no tag; the tags are: {_known_words(known)}"
            )
        return [SliceSpec((tag,)) for tag in matched]
    for part in parts:
        if any(ch in part for ch in GLOB_CHARS):
            raise SliceError(
                f"slice {expression!r}: a slice of several tags names each exactly (no glob)"
            )
        problem = tag_problem(part)
        if problem is not None:
            raise SliceError(f"slice {expression!r}: {problem}")
        if part not in known:
            raise SliceError(
                f"slice {expression!r}: no scenario carries the tag {part!r}; the tags are: "
                f"{_known_words(known)}"
            )
    if len(set(parts)) != len(parts):
        raise SliceError(f"slice {expression!r}: a tag is named twice")
    return [SliceSpec(tuple(parts))]


def select_slices(expressions: Iterable[str], known: Sequence[str]) -> list[SliceSpec]:
    """The slices the expressions name, each once, in the order given (a glob's tags in
    slice order); with no expression, every known tag."""
    chosen: dict[str, SliceSpec] = {}
    given = list(expressions)
    for expression in given:
        for spec in parse_slice(expression, known):
            chosen.setdefault(spec.name, spec)
    if not given:
        chosen = {tag: SliceSpec((tag,)) for tag in known}
    return list(chosen.values())


def _m2_interval(block: RateBlock) -> str:
    ci = block.get("ci95")
    if not ci:
        return "-"
    method = str(block.get("ci95_method"))
    how = METHOD_WORDS.get(method, method).replace(" by scenario", "")
    return f"[{percent(ci[0])}, {percent(ci[1])}] ({how}, {block.get('clusters')} scenarios)"


def slice_table(slices: Mapping[str, SliceBlock]) -> list[str]:
    """A run's ``slices`` block as terminal lines: a heading, then one row per tag.

    m1 with its 95% Wilson interval, m2 with its interval clustered by scenario (over the
    slice's aligned scenarios), unaligned scenarios, and the m1 MDE: the smallest m1
    difference the slice could show against another run at best. ``[]`` without slices.
    """
    if not slices:
        return []
    rows = [
        [
            "slice",
            "n",
            "m1 final-query",
            "m1 95% CI",
            "m2 turn-level",
            "m2 95% CI",
            "unal.",
            "m1 MDE",
        ]
    ]
    for tag, block in slices.items():
        m1, m2 = block["m1"], block["m2"]
        ci = m1.get("ci95")
        mde = block["m1_mde_pp"]
        rows.append(
            [
                tag,
                str(block["n"]),
                score_text(m1["correct"], m1["total"], m1["rate"]),
                f"[{percent(ci[0])}, {percent(ci[1])}]" if ci else "-",
                score_text(m2["correct"], m2["total"], m2["rate"]),
                _m2_interval(m2),
                str(block["unaligned"]),
                "n/a" if mde is None else f"{mde:.1f} pp",
            ]
        )
    return [
        f"slices ({len(slices)} tags; a scenario counts in every slice it is tagged with):",
        *("  " + line for line in columns(rows)),
        "  m1 MDE: the smallest m1 difference a comparison of this slice could detect at best "
        "(every changed scenario changing one way; 80% power, alpha 0.05, one slice alone)",
    ]
