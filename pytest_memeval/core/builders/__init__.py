"""Benchmark builders: named functions that turn source data into benchmark records.

A builder is selected by the ``builder`` key of a benchmark options table, e.g.::

    benchmark = { builder = "scene_memory", tasks = "demo/data/tasks_val.jsonl" }

and is called as ``build(options, rootdir)``, returning an iterator of record dicts in the
public benchmark format (``id``, ``messages``, ``memory_chain``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_memeval.core.builders import scene_memory

__all__ = ["BUILDERS", "Builder"]

#: A builder: ``(options, rootdir) -> records``.
Builder = Callable[[Mapping[str, Any], Path], Iterator[dict[str, Any]]]

#: Registered builders by name.
BUILDERS: dict[str, Builder] = {"scene_memory": scene_memory.build}
