"""Scenario ids and pytest ids: the one mapping between them.

A scenario id is any non-empty string a benchmark holds (``café 1``, ``a/b#2 [x]``,
``Straße:3``, 200 characters long). pytest cannot use such a string as a parametrize id
as it is: it escapes non-ASCII (``caf\\xe9 1``), a ``::`` splits a node id given on the command
line, ``[``/``]`` make the parameter ambiguous in a node id, and ``-k`` accepts only a few
characters in a name. So each scenario gets a **pytest id**:

* the scenario id itself when it is made only of ``A-Z a-z 0-9 _ . - +`` and is at most
  :data:`MAX_PLAIN` characters long (every id of the demo benchmark, ``s0001``);
* otherwise a readable ASCII slug of it followed by ``-`` and 10 hex digits of
  its SHA-256: ``café 1`` -> ``cafe_1-<hash>``.

A pytest id is therefore ASCII, printable, and made only of characters that pytest leaves as
they are and that ``-k`` accepts in a name, so ``-k``, ``--deselect``, ``--lf``, node ids on
the command line and JUnit all see the same string. It is deterministic (a function of the
scenario id alone), so every process and every later run agree.

The reverse direction (a node id or item name back to a scenario) needs the benchmark:
:class:`IdMap` is built from the benchmark's ids, refuses two ids with the same pytest id
(at load, naming both), and is the one place that parses node ids
(:meth:`IdMap.scenario_of`).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

__all__ = [
    "MAX_PLAIN",
    "IdCollision",
    "IdMap",
    "item_name",
    "param_id",
    "split_item_name",
]

#: The longest scenario id used as its own pytest id; longer ones get the slug form.
MAX_PLAIN = 120
_PLAIN = re.compile(r"[A-Za-z0-9_.+\-]+")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.+\-]+")
_SLUG_MAX = 40
_HASH_HEX = 10
# A node id's last part: an item name, ``function[param]`` (a pytest id has no brackets).
_ITEM = re.compile(r"(?P<func>[A-Za-z_][A-Za-z0-9_]*)\[(?P<param>[^\[\]]+)\]")


def param_id(sid: str) -> str:
    """The pytest parametrize id of scenario ``sid`` (see the module docstring)."""
    if len(sid) <= MAX_PLAIN and _PLAIN.fullmatch(sid):
        return sid
    # Accents are dropped (é -> e) so the slug stays readable; every other character outside
    # the plain set becomes one "_" per run. The hash keeps distinct ids distinct.
    decomposed = unicodedata.normalize("NFKD", sid)
    ascii_only = "".join(c for c in decomposed if not unicodedata.combining(c))
    slug = _UNSAFE_RUN.sub("_", ascii_only).strip("_")[:_SLUG_MAX].strip("_") or "id"
    digest = hashlib.sha256(sid.encode("utf-8")).hexdigest()[:_HASH_HEX]
    return f"{slug}-{digest}"


def item_name(function: str, sid: str) -> str:
    """The name pytest gives eval item ``function`` of scenario ``sid``: ``function[pid]``."""
    return f"{function}[{param_id(sid)}]"


def split_item_name(name_or_nodeid: str) -> tuple[str, str] | None:
    """``(function, pytest id)`` of an item name or node id, ``None`` if not parametrized."""
    last = name_or_nodeid.rsplit("::", 1)[-1]
    m = _ITEM.fullmatch(last)
    return (m["func"], m["param"]) if m else None


class IdCollision(ValueError):
    """Two scenario ids of one benchmark have the same pytest id (``first`` came first)."""

    def __init__(self, first: str, second: str, pytest_id: str) -> None:
        super().__init__(
            f"scenario ids {first!r} and {second!r} both become pytest id {pytest_id!r}; "
            "rename one of them"
        )
        self.first, self.second, self.pytest_id = first, second, pytest_id


class IdMap:
    """Scenario ids <-> pytest ids for one set of scenarios."""

    def __init__(self, ids: Iterable[str]) -> None:
        self.by_pytest_id: dict[str, str] = {}
        for sid in ids:
            pid = param_id(sid)
            other = self.by_pytest_id.setdefault(pid, sid)
            if other != sid:
                raise IdCollision(other, sid, pid)

    def scenario_of(self, name_or_nodeid: str) -> str | None:
        """The scenario of an eval item's node id or name, ``None`` for any other item."""
        parts = split_item_name(name_or_nodeid)
        return self.by_pytest_id.get(parts[1]) if parts else None
