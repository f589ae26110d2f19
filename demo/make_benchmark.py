"""Seeded generator of the demo scene-memory benchmark (kitchen scenes).

Writes, under ``--out`` (default ``demo/data``)::

    init_state_manifest.jsonl   initial door states per scene
    tasks_train.jsonl           training tasks (default mode only)
    tasks_val.jsonl             validation tasks (189 by default, ids s0001...)
    baseline/train.jsonl baseline/val.jsonl    training-format files, built by the builder
    oracle/train.jsonl   oracle/val.jsonl      (same, door-grounded with the manifest)

The training-format files are produced by running ``pytest_memeval.core.builders.scene_memory``
on the task files: this script never renders messages itself.

Usage::

    python demo/make_benchmark.py --seed 0 --out demo/data              # the committed demo set
    python demo/make_benchmark.py --turns 30 --n 50 --out /tmp/t30      # 50 scenarios of 30 turns
    python demo/make_benchmark.py --n 5000 --out /tmp/load              # 5,000-scenario load test

With ``--n`` only a validation set (``tasks_val.jsonl`` + ``baseline/val.jsonl`` +
``oracle/val.jsonl``) is written; ``--turns N`` makes every canonical chain exactly N subtasks.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pytest_memeval.core.benchmark import dump_record, training_format  # noqa: E402
from pytest_memeval.core.builders import scene_memory  # noqa: E402

OPEN_CONTAINERS = ("counter", "sink", "table", "shelf", "stove")
DOOR_CONTAINERS = ("cabinet_left", "cabinet_right", "fridge", "drawer", "microwave", "oven")
OBJECTS = (
    "mug", "plate", "bowl", "apple", "knife", "spoon", "cup", "bread", "egg", "milk",
    "pan", "fork", "banana", "tomato", "glass", "pot", "lettuce", "cheese",
)  # fmt: skip

#: Every word the generator (and the builder's rendering) can produce; the tokenizer's vocabulary.
VOCABULARY = (
    *OPEN_CONTAINERS, *DOOR_CONTAINERS, *OBJECTS, *scene_memory.DOOR_STATES,
    "pick", "from", "place", "in", "open", "close", "where", "is", "?", "yes", "no",
    "to", "objects", "doors", "none", ":", ",", ";",
)  # fmt: skip

N_SCENES = 120
N_TRAIN = 600
N_VAL = 189
P_CLOSED = 0.6


def make_scene(rng: random.Random) -> list[str]:
    """The containers of one kitchen: counter and sink always, plus 3-6 others."""
    others = [c for c in OPEN_CONTAINERS + DOOR_CONTAINERS if c not in ("counter", "sink")]
    return ["counter", "sink", *rng.sample(others, rng.randint(3, 6))]


def make_manifest(rng: random.Random, n: int) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """``n`` scenes: manifest lines (door states) and each scene's container list."""
    lines: list[dict[str, Any]] = []
    containers: dict[str, list[str]] = {}
    for i in range(1, n + 1):
        scene_id = f"k{i:03d}"
        cs = make_scene(rng)
        containers[scene_id] = cs
        doors = {
            c: ("closed" if rng.random() < P_CLOSED else "open") for c in cs if c in DOOR_CONTAINERS
        }
        lines.append({"scene_id": scene_id, "doors": doors})
    return lines, containers


def _move(obj: str, src: str, dst: str) -> dict[str, Any]:
    """A move goal with its canonical subtasks (each door container used is closed after)."""
    subtasks = [f"pick {obj} from {src}"]
    if src in DOOR_CONTAINERS:
        subtasks.append(f"close {src}")
    subtasks.append(f"place {obj} in {dst}")
    if dst in DOOR_CONTAINERS:
        subtasks.append(f"close {dst}")
    return {"goal": f"{obj} to {dst}", "subtasks": subtasks}


def make_task(
    rng: random.Random,
    task_id: str,
    scene_id: str,
    containers: Sequence[str],
    doors: dict[str, str],
    n_turns: int,
) -> dict[str, Any]:
    """One task whose canonical chain has exactly ``n_turns`` subtasks, with a final query."""
    objects = rng.sample(OBJECTS, rng.randint(6, 12))
    loc = {o: rng.choice(containers) for o in objects}
    initial = dict(loc)
    door_cs = [c for c in containers if c in DOOR_CONTAINERS]
    goals: list[dict[str, Any]] = []
    remaining = n_turns
    while remaining > 0:
        # Objects not moved yet are preferred, so most objects move at most once per task.
        unmoved = [o for o in objects if loc[o] == initial[o]] or objects
        candidates = []
        for _ in range(8):
            obj = rng.choice(unmoved)
            dst = rng.choice([c for c in containers if c != loc[obj]])
            g = _move(obj, loc[obj], dst)
            if len(g["subtasks"]) <= remaining:
                candidates.append((obj, dst, g))
        if door_cs and (not candidates or rng.random() < 0.12):
            c = rng.choice(door_cs)
            verb = rng.choice(("open", "close"))
            goals.append({"goal": f"{verb} {c}", "subtasks": [f"{verb} {c}"]})
            remaining -= 1
            continue
        if not candidates:  # no door in the scene: fall back to a short move
            obj = rng.choice([o for o in objects if loc[o] not in DOOR_CONTAINERS] or objects)
            dst = rng.choice([c for c in containers if c != loc[obj]])
            goals.append({"goal": f"{obj} to {dst}", "subtasks": [f"pick {obj} from {loc[obj]}"]})
            loc[obj] = "held"
            remaining -= 1
            continue
        obj, dst, g = candidates[0]
        goals.append(g)
        loc[obj] = dst
        remaining -= len(g["subtasks"])
    goal_objs = [scene_memory.Goal(g["goal"], tuple(g["subtasks"])) for g in goals]
    oracle = [s for _, s in scene_memory.ground_goals(goal_objs, doors)]
    where, state = scene_memory.final_state(initial, doors, oracle)
    placed = [o for o in objects if where[o] != "held"]
    # Query mix: door states (35%), the object of the last move (35%, recent memory) and any
    # object in the scene (30%, long-range memory: its location may be far back in the prompt).
    last_moved = [g["goal"].split()[0] for g in goals if g["goal"].split()[1] == "to"]
    r = rng.random()
    if door_cs and r < 0.35:
        c = rng.choice(door_cs)
        query, answer = f"is {c} open ?", ("yes" if state[c] == "open" else "no")
    else:
        if r < 0.7 and last_moved and where[last_moved[-1]] != "held":
            obj = last_moved[-1]
        else:
            obj = rng.choice(placed)
        query, answer = f"where is {obj} ?", where[obj]
    return {
        "id": task_id,
        "scene_id": scene_id,
        "objects": initial,
        "goals": goals,
        "query": query,
        "answer": answer,
    }


def make_tasks(
    rng: random.Random,
    prefix: str,
    n: int,
    manifest: list[dict[str, Any]],
    containers: dict[str, list[str]],
    turns: int | None,
) -> list[dict[str, Any]]:
    """``n`` tasks over random scenes; chain length ``turns`` or uniform in 6..40."""
    out = []
    for i in range(1, n + 1):
        scene = rng.choice(manifest)
        sid = scene["scene_id"]
        n_turns = turns if turns is not None else rng.randint(6, 40)
        out.append(
            make_task(rng, f"{prefix}{i:04d}", sid, containers[sid], scene["doors"], n_turns)
        )
    return out


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write rows with the canonical serialisation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(dump_record(row))


def build_split(out: Path, tasks_name: str, split: str) -> dict[str, int]:
    """Run the builder on one task file for both variants; return counts."""
    stats = {}
    for variant in ("baseline", "oracle"):
        options: dict[str, Any] = {"builder": "scene_memory", "tasks": tasks_name}
        if variant == "oracle":
            options["init_state_manifest"] = "init_state_manifest.jsonl"
        records = list(scene_memory.build(options, out))
        # Training format: the builder's tags and meta are evaluation metadata.
        write_jsonl(out / variant / f"{split}.jsonl", [training_format(r) for r in records])
        unaligned = 0
        for r in records:
            n_turns = sum(m["role"] == "assistant" for m in r["messages"]) - 1
            unaligned += n_turns != len(r["memory_chain"])
        stats[f"{variant}_{split}_unaligned"] = unaligned
        stats[f"{variant}_{split}_n"] = len(records)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "demo" / "data")
    ap.add_argument("--n", type=int, default=None, help="only a validation set of N scenarios")
    ap.add_argument("--turns", type=int, default=None, help="canonical chain length of every task")
    ap.add_argument("--n-train", type=int, default=N_TRAIN)
    ap.add_argument("--n-scenes", type=int, default=N_SCENES)
    args = ap.parse_args(argv)
    if args.turns is not None and args.turns < 1:
        ap.error("--turns must be >= 1")

    out: Path = args.out
    manifest, containers = make_manifest(random.Random(f"{args.seed}-scenes"), args.n_scenes)
    write_jsonl(out / "init_state_manifest.jsonl", manifest)
    n_val = args.n if args.n is not None else N_VAL
    n_train = 0 if args.n is not None else args.n_train
    val = make_tasks(
        random.Random(f"{args.seed}-val"), "s", n_val, manifest, containers, args.turns
    )
    write_jsonl(out / "tasks_val.jsonl", val)
    stats = build_split(out, "tasks_val.jsonl", "val")
    if n_train:
        train = make_tasks(
            random.Random(f"{args.seed}-train"), "t", n_train, manifest, containers, args.turns
        )
        write_jsonl(out / "tasks_train.jsonl", train)
        stats.update(build_split(out, "tasks_train.jsonl", "train"))
    print(json.dumps({"out": str(out), **stats}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
