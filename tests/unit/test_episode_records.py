"""A closed-loop run's records and numbers (core/episode_records.py) and its profile keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.episode_records import (
    EpisodeRecordError,
    episode_from_record,
    episode_record,
    finalize_episode_run,
    read_episode_records,
    recount_episodes,
    validate_episode_record,
)
from pytest_memeval.core.profiles import (
    ProfileError,
    profile_from_plain,
    profile_to_plain,
    resolve_profile,
)
from pytest_memeval.env import Episode, StepRecord, TerminationReason, parse_env_spec

SPEC = parse_env_spec(
    {
        "backend": "textworld_express",
        "game": "twc",
        "params": "numLocations=1,numItemsToPutAway=2",
        "fold": "test",
        "seeds": "0-3",
    }
)


def _episode(seed: int, reason: TerminationReason, actions: int, valid: bool = False) -> Episode:
    steps = tuple(
        StepRecord(f"act {n}", f"obs {n}", 0.0, 0.0, valid, n == 0) for n in range(actions)
    )
    return Episode(
        seed=seed,
        reason=reason,
        steps=steps,
        observation=f"room {seed}",
        messages=({"role": "system", "content": "task"}, {"role": "user", "content": "room"}),
        score=1.0 if reason is TerminationReason.SUCCESS else 0.0,
        error="EnvError: gone" if reason is TerminationReason.ENV_ERROR else None,
    )


EPISODES = [
    _episode(0, TerminationReason.SUCCESS, 3, valid=True),
    _episode(1, TerminationReason.STEP_LIMIT, 5),
    _episode(2, TerminationReason.ENV_ERROR, 1),
    _episode(3, TerminationReason.INVALID_ACTIONS, 2),
]


def test_a_record_holds_the_episode_and_gives_it_back() -> None:
    record = episode_record(SPEC, EPISODES[0])
    assert record["id"] == "twc-0" and record["system"] == "task" and record["success"]
    assert record["tags"] == [
        "game:twc",
        "fold:test",
        "numItemsToPutAway=2",
        "numLocations=1",
    ]
    assert validate_episode_record(json.loads(json.dumps(record)), "f:1") == record
    back = episode_from_record(record)
    assert (back.seed, back.reason, back.steps, back.score) == (
        0,
        EPISODES[0].reason,
        EPISODES[0].steps,
        1.0,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": "0"}, "field 'seed' must be int"),
        ({"success": 1}, "field 'success' must be bool"),
        ({"reason": "gave_up"}, "field 'reason' must be one of"),
        ({"success": False}, "'success' disagrees with 'reason'"),
        ({"steps": 2}, "'steps' is not the trajectory's length"),
        ({"trajectory": [{"action": "x"}] * 3}, "trajectory step 1: missing field"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(
    change: dict[str, object], message: str
) -> None:
    record = {**episode_record(SPEC, EPISODES[0]), **change}
    with pytest.raises(EpisodeRecordError, match=f"f.jsonl:7.*{message}"):
        validate_episode_record(record, "f.jsonl:7")


def test_the_run_is_written_recounted_and_says_what_is_incomplete(tmp_path: Path) -> None:
    records = {f"twc-{e.seed}": episode_record(SPEC, e) for e in EPISODES[:3]}
    ids = [f"twc-{s}" for s in SPEC.seeds]
    metrics = finalize_episode_run(
        tmp_path,
        profile="p",
        env=SPEC.as_plain(),
        fingerprints={"model": "sha256:x"},
        ids=ids,
        records=records,
        wall_s=1.5,
    )
    assert not metrics["complete"]
    assert metrics["missing"] == ["twc-3"] and metrics["error_ids"] == ["twc-2"]
    numbers = metrics["episodes"]
    assert numbers["episodes"] == 3 and numbers["errors"] == 1
    assert (numbers["success"]["correct"], numbers["success"]["total"]) == (1, 2)
    assert numbers["steps"] == {"total": 8, "mean": 4.0, "mean_successful": 3.0}
    assert numbers["invalid_actions"] == {"invalid": 5, "judged": 8, "rate": 5 / 8}
    assert set(metrics["slices"]) == {
        "game:twc",
        "fold:test",
        "numItemsToPutAway=2",
        "numLocations=1",
    }
    on_disk = json.loads((tmp_path / "metrics.json").read_text("utf-8"))
    assert on_disk == json.loads(json.dumps(metrics))
    predictions = tmp_path / "predictions.jsonl"
    assert [r["id"] for r in read_episode_records(predictions)] == ["twc-0", "twc-1", "twc-2"]
    assert recount_episodes(predictions, on_disk) == []
    edited = predictions.read_text("utf-8").replace(
        '"reason": "step_limit", "score": 0.0', '"reason": "failure", "score": 0.0'
    )
    predictions.write_text(edited, "utf-8")
    assert recount_episodes(predictions, on_disk) == ["episodes"] + [
        f"slices[{t}]" for t in sorted(on_disk["slices"])
    ]


def test_a_malformed_predictions_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps(episode_record(SPEC, EPISODES[1])) + "\n{oops\n", "utf-8")
    with pytest.raises(EpisodeRecordError, match=r"predictions.jsonl:2: not JSON"):
        read_episode_records(path)


def _profiles(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.memeval.ckpt.p]\nmodel = "m"\n' + body, "utf-8")
    return path


def test_a_profile_with_env_needs_no_benchmark_and_travels_to_workers(tmp_path: Path) -> None:
    path = _profiles(
        tmp_path,
        'system = "Tidy up."\n'
        'env = { backend = "textworld_express", game = "twc", seeds = "0-4", max_steps = 9 }\n',
    )
    profile = resolve_profile("p", path)
    assert profile.env is not None and profile.env.seeds == (0, 1, 2, 3, 4)
    assert profile.env.max_steps == 9 and profile.system == "Tidy up."
    assert profile_from_plain(json.loads(json.dumps(profile_to_plain(profile)))) == profile


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('env = { backend = "x", game = "y" }\n', r"\[tool.memeval.ckpt.p\]: env: missing"),
        ('env = { backend = "x", game = "y", seeds = "3-1" }\n', r"ckpt.p\]: env.seeds"),
        ('system = "s"\nbenchmark = "b.jsonl"\n', "'system' is for a closed-loop profile"),
        ('system = ""\nenv = { backend = "x", game = "y", seeds = 1 }\n', "non-empty string"),
    ],
)
def test_a_bad_env_or_system_names_file_profile_and_key(
    tmp_path: Path, body: str, message: str
) -> None:
    path = _profiles(tmp_path, body)
    with pytest.raises(ProfileError, match=message) as info:
        resolve_profile("p", path)
    assert str(path) in str(info.value)
