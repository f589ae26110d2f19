"""Scenario tags and meta: what a slice is, and the one check of both.

A benchmark record may carry ``tags``, a list of short strings (``"long"``, or ``key:value``
such as ``"query:door-state"``), and ``meta``, a free JSON object. A tag names a *slice*: the
scenarios that carry it, for which metrics.json, the summaries, ``memeval compare`` and the
gates give their own numbers (docs/results-schema.md, docs/statistics.md). ``meta`` is
carried into the records for people and tools to read; nothing is computed from it.

Tags and meta are evaluation metadata, not training data: they are not part of the prompt,
of the training format :func:`~pytest_memeval.core.benchmark.dump_record` writes, or of
what the byte guards compare; they are part of the benchmark's fingerprint.

The limits keep a slice a category, not a scenario, and keep ``predictions.jsonl`` and
``metrics.json`` small: each is checked where tags enter (the benchmark, a record read back
from a file) and refused naming the scenario and the tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MAX_DISTINCT_TAGS",
    "MAX_META_BYTES",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "TAG_PATTERN",
    "check_meta",
    "check_tags",
    "meta_problem",
    "slice_order",
    "tag_problem",
]

#: Most tags one scenario may carry.
MAX_TAGS = 32
#: Longest tag, in characters.
MAX_TAG_CHARS = 64
#: Most distinct tags a benchmark may carry (each is a slice in every metrics.json).
MAX_DISTINCT_TAGS = 256
#: Largest ``meta`` object, as compact UTF-8 JSON (it is copied into every record).
MAX_META_BYTES = 4096
#: A tag: a letter, digit or ``_`` first, then those and ``. : / + @ -``. No spaces, and none
#: of ``= , & * ? [ ]``: a tag is written on the command line as ``TAG=RATE`` (gates) and in
#: slice patterns (``memeval compare --slice 'query:*'``).
TAG_PATTERN = re.compile(r"\w[\w.:/+@-]*")


def tag_problem(tag: object) -> str | None:
    """What is wrong with one tag, or ``None`` when it is a valid tag."""
    if not isinstance(tag, str):
        return f"a tag must be a string, got {json.dumps(tag, default=repr)[:40]}"
    if not tag:
        return "a tag must not be empty"
    if len(tag) > MAX_TAG_CHARS:
        return f"tag {tag[:20]!r}... is {len(tag)} characters long (at most {MAX_TAG_CHARS})"
    if not TAG_PATTERN.fullmatch(tag):
        return (
            f"tag {tag!r} has a character a tag may not hold: a letter, digit or '_' first, then "
            "letters, digits and _ . : / + @ - (no spaces, no = , & * ? [ ])"
        )
    return None


def check_tags(value: object) -> tuple[str, ...]:
    """A scenario's ``tags`` (a list of valid, distinct tags, at most :data:`MAX_TAGS`).

    Raises ``ValueError`` saying what is wrong; the caller names the scenario.
    """
    if not isinstance(value, list):
        raise ValueError(f"field 'tags' must be a list of strings, got {type(value).__name__}")
    if len(value) > MAX_TAGS:
        raise ValueError(f"field 'tags' has {len(value)} tags (at most {MAX_TAGS})")
    seen: set[str] = set()
    for i, tag in enumerate(value):
        problem = tag_problem(tag)
        if problem is not None:
            raise ValueError(f"field 'tags[{i}]': {problem}")
        if tag in seen:
            raise ValueError(f"field 'tags[{i}]': tag {tag!r} is given twice")
        seen.add(tag)
    return tuple(value)


def meta_problem(value: object) -> str | None:
    """What is wrong with a ``meta`` value, or ``None`` for a JSON object within the size."""
    if not isinstance(value, dict):
        return f"field 'meta' must be a JSON object, got {type(value).__name__}"
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"field 'meta' must hold JSON data only ({exc})"
    size = len(text.encode("utf-8"))
    if size > MAX_META_BYTES:
        return f"field 'meta' is {size} bytes as JSON (at most {MAX_META_BYTES})"
    return None


def check_meta(value: object) -> dict[str, Any]:
    """A scenario's ``meta`` as plain JSON data (a copy; tuples become lists).

    Raises ``ValueError`` saying what is wrong; the caller names the scenario.
    """
    problem = meta_problem(value)
    if problem is not None:
        raise ValueError(problem)
    copied: dict[str, Any] = json.loads(json.dumps(value, ensure_ascii=False))
    return copied


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """``chain:1-10`` before ``chain:11-20`` before ``chain:101-110``: numbers by value."""
    return tuple(
        (0, int(part)) if part.isdecimal() else (1, part)
        for part in re.split(r"(\d+)", text)
        if part
    )


def slice_order(tags: Iterable[str]) -> list[str]:
    """Distinct ``tags`` in the order slices are shown: grouped by key (the part before the
    first ``:``, a tag without one is its own key), numbers inside a tag by value."""
    return sorted(set(tags), key=lambda tag: (_natural(tag.split(":", 1)[0]), _natural(tag)))
