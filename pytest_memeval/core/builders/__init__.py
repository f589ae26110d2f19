"""Benchmark builders: named functions that turn source data into benchmark records.

A builder is selected by the ``builder`` key of a benchmark options table, e.g.::

    benchmark = { builder = "scene_memory", tasks = "demo/data/tasks_val.jsonl" }

and is called as ``build(options, rootdir)``, returning an iterator of record dicts in the
public benchmark format (``id``, ``messages``, ``memory_chain``).

:func:`load_profile_benchmark` is the one way a profile's scenarios are loaded: the plugin
passes the ``pytest_memeval_build_benchmark`` hook as the builder lookup (so builders from
other plugins are found), ``memeval bench`` the bundled builders (:func:`build_bundled`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_memeval.core.benchmark import Benchmark, BenchmarkError, from_records, load_jsonl
from pytest_memeval.core.builders import scene_memory, twc_gold
from pytest_memeval.core.profiles import Profile

__all__ = ["BUILDERS", "Builder", "BuilderLookup", "build_bundled", "load_profile_benchmark"]

#: A builder: ``(options, rootdir) -> records``.
Builder = Callable[[Mapping[str, Any], Path], Iterator[dict[str, Any]]]

#: Registered builders by name.
BUILDERS: dict[str, Builder] = {"scene_memory": scene_memory.build, "twc_gold": twc_gold.build}

#: Finds a builder by name and runs it: ``(builder, options, rootdir) -> records``, or
#: ``None`` when no builder of that name is known.
BuilderLookup = Callable[[str, Mapping[str, Any], Path], Iterable[Mapping[str, Any]] | None]


def build_bundled(
    builder: str, options: Mapping[str, Any], rootdir: Path
) -> Iterable[Mapping[str, Any]] | None:
    """Run a bundled builder (:data:`BUILDERS`), or return ``None`` if ``builder`` is not one.

    A builder's own read or data error becomes a :class:`BenchmarkError` tagged with the
    builder's name (the builder names the file and line).
    """
    build = BUILDERS.get(builder)
    if build is None:
        return None
    try:
        return list(build(options, rootdir))
    except BenchmarkError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise BenchmarkError(f"builder {builder!r}: {exc}") from None


def load_profile_benchmark(profile: Profile, build: BuilderLookup = build_bundled) -> Benchmark:
    """The profile's scenarios, validated: from its JSONL file, or from its builder as found
    by ``build`` (default: only the bundled builders)."""
    spec = profile.benchmark
    if spec.path is not None:
        return load_jsonl(spec.path)
    assert spec.builder is not None
    records = build(spec.builder, spec.options, profile.root)
    if records is None:
        raise BenchmarkError(
            f"{profile.source}: [tool.memeval.ckpt.{profile.name}]: no plugin implements "
            f"benchmark builder {spec.builder!r}"
        )
    return from_records(records, f"builder {spec.builder!r} ({profile.name})")
