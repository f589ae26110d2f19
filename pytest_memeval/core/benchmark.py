"""Benchmark records: the first step of the data flow.

A benchmark is a JSONL file (or a builder's output) of scenario records::

    {"id": "s0001",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", ...},
                  {"role": "assistant", "content": "pick mug from counter"}, ...,
                  {"role": "user", "content": "where is the mug?"},
                  {"role": "assistant", "content": "cabinet_left"}],
     "memory_chain": ["pick mug from counter", ...],
     "tags": ["query:recent-object", "chain:11-20"], "meta": {"scene_id": "k003"}}

``tags`` and ``meta`` are optional evaluation metadata (:mod:`pytest_memeval.core.tags`):
they name the slices a scenario belongs to and travel into its record, but they are not part
of the training format (:meth:`Scenario.to_record`) or of any prompt.

This module validates records into :class:`Scenario` objects and raises
:class:`BenchmarkError` naming the file and line (or scenario) for anything malformed.
Nothing here imports torch: the model-free contracts and ``--help`` stay fast.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pytest_memeval.core.ids import IdCollision, IdMap
from pytest_memeval.core.tags import MAX_DISTINCT_TAGS, check_meta, check_tags, slice_order

__all__ = [
    "ROLES",
    "Benchmark",
    "BenchmarkError",
    "Scenario",
    "dump_record",
    "load_jsonl",
    "parse_record",
    "read_jsonl_records",
    "training_format",
]

#: Roles a message may carry. Anything else is a data error, not a silent skip.
ROLES = ("system", "user", "assistant")
#: Fields of a benchmark record that are evaluation metadata, not training data.
METADATA_FIELDS = ("tags", "meta")


class BenchmarkError(ValueError):
    """A benchmark file or builder produced data the harness cannot evaluate.

    The message always names where: ``path:line`` for files, the scenario id for records.
    """


def dump_record(record: Mapping[str, Any]) -> str:
    """Canonical training-format serialisation of one scenario: one JSONL line.

    The byte guards compare this exact serialisation with the training files, so it must not
    change: key order is the record's own, non-ASCII text is kept as UTF-8.
    """
    return json.dumps(record, ensure_ascii=False) + "\n"


def training_format(record: Mapping[str, Any]) -> dict[str, Any]:
    """A benchmark record without its evaluation metadata (``tags``, ``meta``): what a
    training-format file holds (the demo generator writes its files with it)."""
    return {k: v for k, v in record.items() if k not in METADATA_FIELDS}


@dataclass(frozen=True)
class Scenario:
    """One validated scenario.

    ``assistant_indices`` are the positions in ``messages`` of the assistant messages; the
    last of them is the final answer (m1), the others are turns (m2).
    """

    id: str
    index: int
    messages: tuple[Mapping[str, str], ...]
    memory_chain: tuple[str, ...] | None
    source: str
    #: the slices the scenario belongs to (``tags`` of the record; evaluation metadata)
    tags: tuple[str, ...] = ()
    #: the record's free ``meta`` object, carried into its record (``None``: not given)
    meta: Mapping[str, Any] | None = None

    @property
    def assistant_indices(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.messages) if m["role"] == "assistant")

    @property
    def turn_indices(self) -> tuple[int, ...]:
        """Message indices of the non-final assistant turns."""
        return self.assistant_indices[:-1]

    @property
    def final_index(self) -> int:
        return self.assistant_indices[-1]

    @property
    def final_gt(self) -> str:
        return self.messages[self.final_index]["content"]

    @property
    def aligned(self) -> bool:
        """True when turn i can be scored against ``memory_chain[i]`` (or no chain is given)."""
        if self.memory_chain is None:
            return True
        return len(self.memory_chain) == len(self.turn_indices)

    def turn_gt(self, turn: int) -> str | None:
        """Ground truth of turn ``turn``; ``None`` where the scenario is unaligned."""
        if self.memory_chain is None:
            return self.messages[self.turn_indices[turn]]["content"]
        if not self.aligned:
            return None
        return self.memory_chain[turn]

    @property
    def granularity(self) -> str:
        """How turns are scored: ``memory_chain``, ``message`` (no chain) or ``unaligned``."""
        if self.memory_chain is None:
            return "message"
        return "memory_chain" if self.aligned else "unaligned"

    def to_record(self, *, metadata: bool = False) -> dict[str, Any]:
        """The scenario as a record: by default the training format (``id``, ``messages``,
        ``memory_chain``), what :func:`dump_record` writes and the byte guards compare;
        ``metadata`` adds ``tags`` and ``meta`` where the scenario has them (the benchmark's
        fingerprint covers them)."""
        record: dict[str, Any] = {"id": self.id, "messages": [dict(m) for m in self.messages]}
        if self.memory_chain is not None:
            record["memory_chain"] = list(self.memory_chain)
        if metadata and self.tags:
            record["tags"] = list(self.tags)
        if metadata and self.meta is not None:
            record["meta"] = dict(self.meta)
        return record


def _fail(where: str, what: str) -> BenchmarkError:
    return BenchmarkError(f"{where}: {what}")


def parse_record(obj: Any, *, where: str, index: int) -> Scenario:
    """Validate one decoded record; ``where`` names its origin (``file:line`` or builder)."""
    if not isinstance(obj, dict):
        return _raise(where, f"a scenario must be a JSON object, got {type(obj).__name__}")
    sid = obj.get("id")
    if not isinstance(sid, str) or not sid.strip():
        return _raise(where, "field 'id' is missing or not a non-empty string")
    where = f"{where} (scenario {sid!r})"
    unknown = set(obj) - {"id", "messages", "memory_chain", "tags", "meta"}
    if unknown:
        return _raise(where, f"unknown field(s) {sorted(unknown)}")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return _raise(where, "field 'messages' is missing or not a non-empty list")
    checked: list[Mapping[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return _raise(where, f"messages[{i}] is not an object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            return _raise(
                where, f"messages[{i}] has unknown role {role!r} (expected one of {ROLES})"
            )
        if not isinstance(content, str):
            return _raise(where, f"messages[{i}].content is missing or not a string")
        extra = set(message) - {"role", "content"}
        if extra:
            return _raise(where, f"messages[{i}] has unknown field(s) {sorted(extra)}")
        checked.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in checked):
        return _raise(where, "the conversation has no assistant turn")
    if checked[-1]["role"] != "assistant":
        return _raise(
            where,
            f"the conversation ends on a {checked[-1]['role']!r} message; the last message "
            "must be the assistant's final answer",
        )
    chain = obj.get("memory_chain")
    if chain is not None and (
        not isinstance(chain, list) or not all(isinstance(s, str) for s in chain)
    ):
        return _raise(where, "field 'memory_chain' must be a list of strings")
    try:
        tags = check_tags(obj["tags"]) if "tags" in obj else ()
        meta = check_meta(obj["meta"]) if "meta" in obj else None
    except ValueError as exc:
        return _raise(where, str(exc))
    return Scenario(
        id=sid,
        index=index,
        messages=tuple(checked),
        memory_chain=tuple(chain) if chain is not None else None,
        source=where,
        tags=tags,
        meta=meta,
    )


def _raise(where: str, what: str) -> Scenario:
    raise _fail(where, what)


def read_jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, decoded_json)`` for each non-blank line of ``path``.

    A UTF-8 byte-order mark is refused rather than silently stripped: training files are
    compared byte for byte, and a BOM is a byte.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BenchmarkError(f"{path}: benchmark file not found") from None
    except OSError as exc:
        raise BenchmarkError(f"{path}: cannot read benchmark file ({exc.strerror})") from None
    if raw.startswith(codecs.BOM_UTF8):
        raise BenchmarkError(
            f"{path}:1: file starts with a UTF-8 byte-order mark; save it as plain UTF-8"
        )
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BenchmarkError(
                f"{path}:{lineno}: not valid UTF-8 "
                f"(byte {exc.start}: {line[exc.start : exc.start + 1]!r})"
            ) from None
        try:
            yield lineno, json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(
                f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})"
            ) from None


@dataclass(frozen=True)
class Benchmark:
    """Validated scenarios in benchmark order, with where they came from and a fingerprint."""

    scenarios: tuple[Scenario, ...]
    source: str
    fingerprint: str

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.scenarios]

    @cached_property
    def tags(self) -> list[str]:
        """Every tag of the benchmark, in the order slices are shown."""
        return slice_order(tag for s in self.scenarios for tag in s.tags)

    def by_id(self) -> dict[str, Scenario]:
        return {s.id: s for s in self.scenarios}

    @cached_property
    def id_map(self) -> IdMap:
        """Scenario ids <-> pytest ids (unique: :func:`_collect` refused collisions)."""
        return IdMap(self.ids)


def _collect(items: Iterable[tuple[str, Any]], source: str) -> Benchmark:
    scenarios: list[Scenario] = []
    seen: dict[str, str] = {}
    distinct: set[str] = set()
    digest = hashlib.sha256()
    for where, obj in items:
        scenario = parse_record(obj, where=where, index=len(scenarios))
        if scenario.id in seen:
            raise BenchmarkError(
                f"{where}: duplicate scenario id {scenario.id!r} "
                f"(first seen at {seen[scenario.id]})"
            )
        seen[scenario.id] = where
        # Tags and meta are in the fingerprint (they decide the slices of the metrics), and
        # only where given: an untagged benchmark keeps the fingerprint it always had.
        digest.update(dump_record(scenario.to_record(metadata=True)).encode("utf-8"))
        scenarios.append(scenario)
        distinct.update(scenario.tags)
        if len(distinct) > MAX_DISTINCT_TAGS:
            raise BenchmarkError(
                f"{where}: the benchmark has more than {MAX_DISTINCT_TAGS} distinct tags: a tag "
                "names a slice of scenarios (a category), not a scenario; put per-scenario "
                "values in 'meta'"
            )
    if not scenarios:
        raise BenchmarkError(f"{source}: the benchmark has no scenarios")
    benchmark = Benchmark(tuple(scenarios), source, "sha256:" + digest.hexdigest())
    # Each scenario is a pytest item named by its pytest id (ids.param_id); two ids with one
    # pytest id would be one item. Practically impossible (a 40-bit hash), but refused here,
    # at load, by the one check (IdMap's), naming both ids and where they are.
    try:
        benchmark.id_map  # noqa: B018 - built (and cached) for its check
    except IdCollision as exc:
        raise BenchmarkError(
            f"{seen[exc.second]}: scenario id {exc.second!r} has the same pytest id "
            f"{exc.pytest_id!r} as scenario {exc.first!r} (at {seen[exc.first]}); "
            "rename one of them"
        ) from None
    return benchmark


def load_jsonl(path: Path) -> Benchmark:
    """Load and validate a benchmark JSONL file."""
    return _collect(((f"{path}:{n}", obj) for n, obj in read_jsonl_records(path)), str(path))


def from_records(records: Iterable[Any], source: str) -> Benchmark:
    """Validate records produced by a builder; errors name ``source`` and the record number."""
    return _collect(((f"{source} record {i + 1}", r) for i, r in enumerate(records)), source)
