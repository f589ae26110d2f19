"""Which scenario a collected pytest item evaluates.

Kept in runtime/ rather than core/ids.py: it reads a ``pytest.Item`` (its ``callspec``),
and core/ holds plain data only. The node-id parsing that needs no item stays in
:mod:`pytest_memeval.core.ids` (``IdMap.scenario_of``, ``split_item_name``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

__all__ = ["scenario_param"]


def scenario_param(item: pytest.Item) -> str | None:
    """The scenario id an eval item is parametrized with, or ``None`` for other items."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("memeval_scenario")
    return value if isinstance(value, str) else None
