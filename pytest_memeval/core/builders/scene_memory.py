"""Scene-memory builder: task chains (+ an optional initial-state manifest) -> benchmark records.

Options come from a TOML table such as::

    {builder = "scene_memory", tasks = "demo/data/tasks_val.jsonl",
     init_state_manifest = "demo/data/init_state_manifest.jsonl"}

with paths relative to ``rootdir``. Without ``init_state_manifest`` the *baseline* variant is
built: every task's canonical subtask chain becomes the assistant turns, so each scenario's
turns equal its ``memory_chain`` (aligned). With the manifest the *oracle* (door-grounded)
variant is built: an ``open X`` subtask is inserted before interacting with a closed door
container, redundant ``close X`` subtasks are consolidated, and the scene's initial door states
go into the system prompt. ``memory_chain`` is the canonical chain in both variants, so oracle
scenarios whose turn count changed are *unaligned* by design.

Task file (JSONL, one task a line)::

    {"id": "s0001", "scene_id": "k003",
     "objects": {"mug": "counter", "apple": "fridge"},
     "goals": [{"goal": "mug to fridge",
                "subtasks": ["pick mug from counter", "place mug in fridge", "close fridge"]},
               {"goal": "open drawer", "subtasks": ["open drawer"]}],
     "query": "where is mug ?", "answer": "fridge"}

Manifest file (JSONL, one scene a line)::

    {"scene_id": "k003", "doors": {"fridge": "closed", "drawer": "open"}}

Containers absent from ``doors`` have no door.

Each record carries ``tags`` (the slices its numbers are also reported for; see
:func:`scenario_tags`) and ``meta`` (``scene_id``, ``chain_length``, and with the manifest
``closes_dropped`` and ``opens_inserted``). They are evaluation metadata, not training data:
the training-format files hold ``id``, ``messages`` and ``memory_chain`` only
(:func:`pytest_memeval.core.benchmark.training_format`).

This module is the only place where scenario messages are rendered: the demo generator
imports it, so the committed training files and what the plugin rebuilds cannot drift apart.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CHAIN_BUCKET",
    "DOOR_STATES",
    "Goal",
    "Task",
    "build",
    "build_records",
    "final_state",
    "ground_goals",
    "load_manifest",
    "load_tasks",
    "parse_subtask",
    "render_record",
    "scenario_tags",
]

#: The values a door may take in the manifest.
DOOR_STATES = ("open", "closed")
#: Width of the chain-length buckets of the ``chain:`` tags (``chain:1-10``, ``chain:11-20``...).
CHAIN_BUCKET = 10

_VERBS = {"pick": ("from", 4), "place": ("in", 4), "open": (None, 2), "close": (None, 2)}


@dataclass(frozen=True)
class Goal:
    """One goal of a task: its user-facing text and its canonical subtasks."""

    text: str
    subtasks: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """One validated task line; ``where`` is ``path:line`` for error messages."""

    id: str
    scene_id: str
    objects: tuple[tuple[str, str], ...]
    goals: tuple[Goal, ...]
    query: str
    answer: str
    where: str

    @property
    def chain(self) -> list[str]:
        """The canonical subtask chain (the ``memory_chain``)."""
        return [s for g in self.goals for s in g.subtasks]


def parse_subtask(text: str) -> tuple[str, str | None, str]:
    """Split a subtask into ``(verb, object, container)``.

    ``pick O from C`` and ``place O in C`` carry an object; ``open C`` and ``close C`` do not
    (object is ``None``). Raises ``ValueError`` for anything else.
    """
    words = text.split()
    if not words or words[0] not in _VERBS:
        raise ValueError(f"unknown subtask {text!r}")
    prep, n = _VERBS[words[0]]
    if len(words) != n or (prep is not None and words[2] != prep):
        raise ValueError(f"malformed subtask {text!r}")
    if prep is None:
        return words[0], None, words[1]
    return words[0], words[1], words[3]


def _read_jsonl(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(line_number, where, parsed_json)`` for each non-blank line of ``path``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read file: {exc}") from exc
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object")
        yield lineno, where, obj


def _word(value: Any, where: str, field: str) -> str:
    """A non-empty, single-word string (no whitespace)."""
    if not isinstance(value, str) or not value or value.split() != [value]:
        raise ValueError(f"{where}: {field} must be a non-empty single word, got {value!r}")
    return value


def _text(value: Any, where: str, field: str) -> str:
    """A non-empty string without surrounding whitespace."""
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError(f"{where}: {field} must be a non-empty stripped string, got {value!r}")
    return value


def _parse_task(obj: Mapping[str, Any], where: str) -> Task:
    """Validate one task line."""
    missing = [k for k in ("id", "scene_id", "objects", "goals", "query", "answer") if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    objects = obj["objects"]
    if not isinstance(objects, dict) or not objects:
        raise ValueError(f"{where}: objects must be a non-empty mapping object -> container")
    placed = tuple(
        (_word(o, where, "object"), _word(c, where, f"container of {o}"))
        for o, c in objects.items()
    )
    goals_raw = obj["goals"]
    if not isinstance(goals_raw, list) or not goals_raw:
        raise ValueError(f"{where}: goals must be a non-empty list")
    goals: list[Goal] = []
    for i, g in enumerate(goals_raw):
        if not isinstance(g, dict) or "goal" not in g or "subtasks" not in g:
            raise ValueError(f"{where}: goals[{i}] must be an object with goal and subtasks")
        subtasks = g["subtasks"]
        if not isinstance(subtasks, list) or not subtasks:
            raise ValueError(f"{where}: goals[{i}].subtasks must be a non-empty list")
        for s in subtasks:
            try:
                parse_subtask(_text(s, where, f"goals[{i}].subtasks"))
            except ValueError as exc:
                raise ValueError(f"{where}: goals[{i}]: {exc}") from None
        goals.append(Goal(_text(g["goal"], where, f"goals[{i}].goal"), tuple(subtasks)))
    return Task(
        id=_word(obj["id"], where, "id"),
        scene_id=_word(obj["scene_id"], where, "scene_id"),
        objects=placed,
        goals=tuple(goals),
        query=_text(obj["query"], where, "query"),
        answer=_text(obj["answer"], where, "answer"),
        where=where,
    )


def load_tasks(path: Path) -> list[Task]:
    """Read and validate a task file; ``ValueError`` names ``path:line`` on bad input."""
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for _, where, obj in _read_jsonl(path):
        task = _parse_task(obj, where)
        if task.id in seen:
            raise ValueError(f"{where}: duplicate task id {task.id!r} (first at {seen[task.id]})")
        seen[task.id] = where
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def load_manifest(path: Path) -> dict[str, dict[str, str]]:
    """Read an initial-state manifest: ``scene_id -> {container: "open" | "closed"}``."""
    scenes: dict[str, dict[str, str]] = {}
    for _, where, obj in _read_jsonl(path):
        if "scene_id" not in obj or "doors" not in obj:
            raise ValueError(f"{where}: manifest lines need scene_id and doors")
        scene_id = _word(obj["scene_id"], where, "scene_id")
        doors = obj["doors"]
        if not isinstance(doors, dict):
            raise ValueError(f"{where}: doors must be a mapping container -> open|closed")
        for c, state in doors.items():
            _word(c, where, "door container")
            if state not in DOOR_STATES:
                raise ValueError(f"{where}: door {c!r} must be 'open' or 'closed', got {state!r}")
        if scene_id in scenes:
            raise ValueError(f"{where}: duplicate scene_id {scene_id!r}")
        scenes[scene_id] = dict(doors)
    return scenes


def ground_goals(goals: Sequence[Goal], doors: Mapping[str, str]) -> list[tuple[str, str]]:
    """The door-grounded (oracle) turns of ``goals`` as ``(goal_text, subtask)`` pairs.

    Walking the canonical subtasks with the door states of ``doors`` (containers not listed
    have no door):

    * ``open C`` is inserted before a ``pick``/``place`` on a door container that is closed;
    * ``close C`` is consolidated: dropped when ``C`` is already closed, or when ``C`` is used
      again by a ``pick``/``place`` later in the same goal or in the next goal.
    """
    state = dict(doors)
    out: list[tuple[str, str]] = []
    for gi, goal in enumerate(goals):
        upcoming = list(goal.subtasks) + (
            list(goals[gi + 1].subtasks) if gi + 1 < len(goals) else []
        )
        for si, subtask in enumerate(goal.subtasks):
            verb, _, container = parse_subtask(subtask)
            has_door = container in state
            if verb in ("pick", "place"):
                if has_door and state[container] == "closed":
                    out.append((goal.text, f"open {container}"))
                    state[container] = "open"
                out.append((goal.text, subtask))
            elif verb == "open":
                if has_door:
                    state[container] = "open"
                out.append((goal.text, subtask))
            else:  # close
                if has_door and state[container] == "closed":
                    continue
                later = upcoming[si + 1 :]
                if any(
                    parse_subtask(s)[0] in ("pick", "place") and parse_subtask(s)[2] == container
                    for s in later
                ):
                    continue
                if has_door:
                    state[container] = "closed"
                out.append((goal.text, subtask))
    return out


def final_state(
    objects: Mapping[str, str], doors: Mapping[str, str], subtasks: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Object locations and door states after executing ``subtasks`` from the initial state.

    A picked object is ``held`` until placed. Used by the generator to compute answers.
    """
    where = dict(objects)
    state = dict(doors)
    for subtask in subtasks:
        verb, obj, container = parse_subtask(subtask)
        if verb == "pick" and obj is not None:
            where[obj] = "held"
        elif verb == "place" and obj is not None:
            where[obj] = container
        elif container in state:
            state[container] = "open" if verb == "open" else "closed"
    return where, state


def _query_kind(task: Task) -> str:
    """``door-state`` (``is C open ?``), ``recent-object`` (``where is X ?`` for the object of
    the chain's last ``place``: its location is the last one the conversation set),
    ``older-object`` (``where is X ?`` for any other object: its location was set earlier,
    by an older move or the initial state, and may lie far back in the prompt), ``other``."""
    words = task.query.split()
    if len(words) == 4 and words[0] == "is" and words[2:] == ["open", "?"]:
        return "door-state"
    if len(words) == 4 and words[:2] == ["where", "is"] and words[3] == "?":
        places = [parse_subtask(s)[1] for s in task.chain if s.startswith("place ")]
        return "recent-object" if places and places[-1] == words[2] else "older-object"
    return "other"


def _door_changes(task: Task, turns: Sequence[str]) -> tuple[int, int]:
    """``(closes dropped, opens inserted)`` by the door-grounded turns against the canonical
    chain (:func:`ground_goals` only ever drops a ``close`` and inserts an ``open``)."""

    def count(verb: str, subtasks: Sequence[str]) -> int:
        return sum(1 for s in subtasks if parse_subtask(s)[0] == verb)

    return (
        count("close", task.chain) - count("close", turns),
        count("open", turns) - count("open", task.chain),
    )


def scenario_tags(task: Task, oracle_turns: Sequence[str] | None = None) -> list[str]:
    """The tags of a task's record: the slices the seed's question is about.

    * ``query:door-state`` / ``query:recent-object`` / ``query:older-object`` (``query:other``
      for a query of neither form): what the final query asks (:func:`_query_kind`);
    * ``chain:LO-HI``: the canonical chain's length, in buckets of :data:`CHAIN_BUCKET`;
    * with the door-grounded turns (the oracle variant, ``oracle_turns``):
      ``oracle:close-dropped`` where a ``close`` of the canonical chain was consolidated away,
      ``oracle:open-inserted`` where an ``open`` was inserted.
    """
    length = len(task.chain)
    low = (length - 1) // CHAIN_BUCKET * CHAIN_BUCKET + 1
    tags = [f"query:{_query_kind(task)}", f"chain:{low}-{low + CHAIN_BUCKET - 1}"]
    if oracle_turns is not None:
        dropped, inserted = _door_changes(task, oracle_turns)
        if dropped:
            tags.append("oracle:close-dropped")
        if inserted:
            tags.append("oracle:open-inserted")
    return tags


def _system_prompt(task: Task, doors: Mapping[str, str] | None) -> str:
    """The system message: object locations, and (oracle) the initial door states."""
    text = "objects : " + " , ".join(f"{o} {c}" for o, c in task.objects)
    if doors is not None:
        listed = " , ".join(f"{c} {s}" for c, s in doors.items()) if doors else "none"
        text += " ; doors : " + listed
    return text


def render_record(task: Task, doors: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Render one task as a benchmark record, with its ``tags`` and ``meta``.

    ``doors is None`` renders the baseline variant (turns = canonical chain); otherwise the
    oracle variant grounded on those initial door states. Each turn's user message is the goal
    the next subtask serves; the final user message is the query.
    """
    if doors is None:
        turns = [(g.text, s) for g in task.goals for s in g.subtasks]
    else:
        turns = ground_goals(task.goals, doors)
    messages: list[dict[str, str]] = [{"role": "system", "content": _system_prompt(task, doors)}]
    for goal_text, subtask in turns:
        messages.append({"role": "user", "content": goal_text})
        messages.append({"role": "assistant", "content": subtask})
    messages.append({"role": "user", "content": task.query})
    messages.append({"role": "assistant", "content": task.answer})
    grounded = None if doors is None else [subtask for _, subtask in turns]
    meta: dict[str, Any] = {"scene_id": task.scene_id, "chain_length": len(task.chain)}
    if grounded is not None:
        dropped, inserted = _door_changes(task, grounded)
        meta.update(closes_dropped=dropped, opens_inserted=inserted)
    return {
        "id": task.id,
        "messages": messages,
        "memory_chain": task.chain,
        "tags": scenario_tags(task, grounded),
        "meta": meta,
    }


def build_records(
    tasks: Sequence[Task], manifest: Mapping[str, Mapping[str, str]] | None
) -> Iterator[dict[str, Any]]:
    """Records for validated ``tasks``; with a manifest, the oracle variant."""
    for task in tasks:
        if manifest is None:
            yield render_record(task)
            continue
        if task.scene_id not in manifest:
            raise ValueError(
                f"{task.where}: task {task.id!r} references unknown scene_id {task.scene_id!r}"
            )
        yield render_record(task, manifest[task.scene_id])


def _option_path(options: Mapping[str, Any], key: str, rootdir: Path) -> Path | None:
    """``rootdir / options[key]``, or ``None`` when the option is absent."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise ValueError(f"scene_memory: option {key!r} must be a path, got {value!r}")
    return Path(rootdir) / value


def build(options: Mapping[str, Any], rootdir: Path) -> Iterator[dict[str, Any]]:
    """Build benchmark records from a builder options table.

    ``tasks`` (required) and ``init_state_manifest`` (optional, selects the oracle variant)
    are paths relative to ``rootdir``. Inputs are read and validated before the first record
    is yielded, so bad input fails fast with a ``ValueError`` naming the file and line.
    """
    known = {"builder", "tasks", "init_state_manifest"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"scene_memory: unknown option(s) {', '.join(unknown)}")
    tasks_path = _option_path(options, "tasks", rootdir)
    if tasks_path is None:
        raise ValueError("scene_memory: the 'tasks' option is required")
    manifest_path = _option_path(options, "init_state_manifest", rootdir)
    tasks = load_tasks(tasks_path)
    manifest = load_manifest(manifest_path) if manifest_path is not None else None
    records = list(build_records(tasks, manifest))
    return iter(records)
