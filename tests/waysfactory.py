"""One model's three runs of the same seeds, for the three-ways comparison's tests
(tools/compare/ways.py): a teacher-forced and a free-running scenario run written as the
plugin writes them (counted by its ``Tally``), and a closed-loop run written by
``finalize_episode_run`` from real episodes, over the seeds ``twc-0`` ... ``twc-4``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_memeval.core.episode_records import episode_record
from pytest_memeval.env import TerminationReason

from .episodefactory import FINGERPRINTS, IDS, SPEC, episode, write_episode_run
from .runfactory import make_record, with_history, write_run

TARGETS = ("open cabinet", "take mug", "put mug in cabinet")  # a wrong turn says "look around"
#: seeds 0-2: every turn right teacher-forced; 3 and 4: the second turn wrong
ALL, SECOND_WRONG, NONE = (True, True, True), (True, False, True), (False, False, False)
TF_MATCHES = {0: ALL, 1: ALL, 2: ALL, 3: SECOND_WRONG, 4: SECOND_WRONG}
#: free-running, seeds 0 and 1 reproduce the gold path; 2-4 leave it at the first turn
FR_MATCHES = {0: ALL, 1: ALL, 2: (False, True, True), 3: NONE, 4: NONE}
#: in the environment: 0 and 4 succeed, 1-3 reach the step limit
SUCCESS = {0: True, 1: False, 2: False, 3: False, 4: True}
FINAL = {0: True, 1: True, 2: False, 3: True, 4: False}
PUT, OPENED = "query:where-put", "query:close-opened"
TAGS = {0: PUT, 1: PUT, 2: PUT, 3: OPENED, 4: OPENED}


def fingerprints(model: str) -> dict[str, Any]:
    return {"benchmark": "sha256:twc", "model": model, "adapter": None, "decoding": "sha256:d"}


def scenario_run(
    path: Path,
    matches: Mapping[int, Sequence[bool]],
    history: str,
    model: str = "sha256:m",
    tags: Mapping[int, str] = TAGS,
) -> Path:
    """A scenario run of ``history`` whose seed ``s`` has the turn outcomes ``matches[s]``."""
    records = []
    for seed, ok in matches.items():
        record = make_record(
            IDS[seed], seed, final_match=FINAL[seed], targets=TARGETS, turn_matches=ok,
            final_gt="cabinet",
        )  # fmt: skip
        record["tags"] = [tags[seed], "rooms:1"]
        records.append(with_history(record, history))
    return write_run(
        path, records, ckpt=path.name, history=history, fingerprints=fingerprints(model)
    )


def loop_run(path: Path, success: Mapping[int, bool], model: str = "sha256:m") -> Path:
    """A closed-loop run whose seed ``s`` succeeded where ``success[s]``."""
    held = {}
    for seed, won in success.items():
        reason = TerminationReason.SUCCESS if won else TerminationReason.STEP_LIMIT
        held[IDS[seed]] = episode_record(SPEC, episode(seed, reason))
    return write_episode_run(
        path, held=held, fingerprints={**FINGERPRINTS, "model": model}, profile=path.name
    )


def write_three_ways(tmp: Path, tags: Mapping[int, str] = TAGS) -> list[Path]:
    """The teacher-forced, free-running and closed-loop runs of one model under ``tmp``."""
    return [
        scenario_run(tmp / "tf", TF_MATCHES, "truth", tags=tags),
        scenario_run(tmp / "fr", FR_MATCHES, "model", tags=tags),
        loop_run(tmp / "loop", SUCCESS),
    ]
