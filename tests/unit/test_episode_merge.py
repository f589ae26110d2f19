"""Closed-loop shards and their merge (tools/episode_merge.py, ``memeval merge``).

The shard directories are written by ``finalize_episode_run`` from real episodes
(tests/episodefactory.py), as the episode controller writes them.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_memeval.core.episode_records import read_episode_records, recount_episodes
from pytest_memeval.core.rundir import METRICS, PREDICTIONS, read_json, write_json
from pytest_memeval.runtime.episodes import finished_run
from pytest_memeval.tools.episode_merge import merge_episode_shards
from pytest_memeval.tools.merge import cli_arguments, cli_main
from pytest_memeval.tools.shard_checks import MergeError
from pytest_memeval.tools.slurm import INCOMPLETE_EXIT, check_shard

from ..episodefactory import (
    FINGERPRINTS,
    IDS,
    records,
    write_episode_run,
    write_episode_shards,
)


def test_a_shard_run_holds_its_slice_says_which_and_is_not_complete(tmp_path: Path) -> None:
    shards = write_episode_shards(tmp_path, 2)
    metrics = read_json(shards[1] / METRICS)
    assert [r["id"] for r in read_episode_records(shards[1] / PREDICTIONS)] == IDS[3:]
    assert metrics["scope"]["shard"] == {
        "spec": "2/2",
        "index": 2,
        "count": 2,
        "start": 3,
        "stop": 5,
        "size": 2,
        "first": "twc-3",
        "last": "twc-4",
        "benchmark_total": 5,
    }
    assert not metrics["complete"] and metrics["missing"] == [] and metrics["error_ids"] == []
    whole = read_json(write_episode_run(tmp_path / "whole") / METRICS)
    assert whole["complete"] and whole["scope"] == {"shard": None}


def test_merged_shards_are_the_unsharded_run(tmp_path: Path) -> None:
    whole = write_episode_run(tmp_path / "whole")
    out = tmp_path / "merged"
    metrics = merge_episode_shards(write_episode_shards(tmp_path / "s", 3), out)
    assert (out / PREDICTIONS).read_bytes() == (whole / PREDICTIONS).read_bytes()
    on_disk = read_json(out / METRICS)
    assert on_disk == json.loads(json.dumps(metrics))
    assert recount_episodes(out / PREDICTIONS, on_disk) == []
    assert on_disk["complete"] and on_disk["missing"] == [] and on_disk["scope"] == {"shard": None}
    assert [m["shard"] for m in on_disk["merged_from"]] == ["1/3", "2/3", "3/3"]
    assert [m["n"] for m in on_disk["merged_from"]] == [2, 2, 1]
    assert on_disk["wall_s"] == 3.0  # the slowest shard
    unsharded = read_json(whole / METRICS)
    for key in ("episodes", "slices", "env", "fingerprints", "profile", "error_ids"):
        assert on_disk[key] == unsharded[key], key
    # A second merge into the same directory replaces the first (it is a merge).
    again = merge_episode_shards(sorted((tmp_path / "s").iterdir(), reverse=True), out)
    assert again["episodes"] == metrics["episodes"]


def _fingerprint(shards: list[Path]) -> str:
    write_episode_run(shards[1], shard=(2, 3), fingerprints={**FINGERPRINTS, "model": "sha256:z"})
    return "model fingerprint differs between shards: *shard 2/3 (*): sha256:z*"


def _missing(shards: list[Path]) -> str:
    shutil.rmtree(shards[2])
    return "*shard-3-of-3: no metrics.json: not a finished run"


def _newer_unfinished(shards: list[Path]) -> str:
    stage = shards[0] / "subsets" / "29991231T000000Z"
    stage.mkdir(parents=True)
    (stage / "journal.jsonl").write_text('{"memeval_journal": 1, "kind": "episodes"}\n')
    return "*shard-1-of-3: a newer unfinished run of this shard is in *29991231T000000Z*"


def _only_two(shards: list[Path]) -> str:
    shards.pop()
    return "missing shard(s): 3/3*"


def _twice(shards: list[Path]) -> str:
    shards.append(shards[0])
    return "shard 1/3 given 2 times*"


def _held_back(shards: list[Path]) -> str:
    held = records()
    del held["twc-3"]
    write_episode_run(shards[1], shard=(2, 3), held=held)
    return "shard 2/3 (*): incomplete, 1 episode(s) have no record: 'twc-3'"


def _edited(shards: list[Path]) -> str:
    metrics = read_json(shards[0] / METRICS)
    metrics["episodes"]["steps"]["total"] += 1
    write_json(shards[0] / METRICS, metrics)
    return "*shard-1-of-3/metrics.json: disagrees with its predictions.jsonl on recount: episodes*"


def _other_n(shards: list[Path]) -> str:
    shutil.rmtree(shards[2])
    shards[2] = write_episode_run(shards[2].parent / "other", shard=(2, 2))
    return "number of shards N differs between shards*"


def _other_profile(shards: list[Path]) -> str:
    write_episode_run(shards[0], shard=(1, 3), profile="twc-other")
    return "profile differs between shards: shard 1/3 (*): twc-other*"


def _swapped(shards: list[Path]) -> str:
    # shard 2's directory rewritten with shard 1's records under shard 2's scope
    metrics = read_json(shards[1] / METRICS)
    shutil.copyfile(shards[0] / PREDICTIONS, shards[1] / PREDICTIONS)
    metrics["episodes"] = read_json(shards[0] / METRICS)["episodes"]
    metrics["slices"] = read_json(shards[0] / METRICS)["slices"]
    write_json(shards[1] / METRICS, metrics)
    return (
        "shard 2/3 (*): holds episodes 'twc-0', 'twc-1', shard 2/3 of the seeds is 'twc-2', 'twc-3'"
    )


@pytest.mark.parametrize(
    "spoil",
    [_fingerprint, _missing, _newer_unfinished, _only_two, _twice, _held_back, _edited,
     _other_n, _other_profile, _swapped],
)  # fmt: skip
def test_shards_that_disagree_are_refused_naming_the_shard_and_nothing_is_written(
    tmp_path: Path, spoil: Callable[[list[Path]], str]
) -> None:
    shards = write_episode_shards(tmp_path / "s", 3)
    pattern = spoil(shards)
    out = tmp_path / "merged"
    with pytest.raises(MergeError) as caught:
        merge_episode_shards(shards, out)
    problems = caught.value.problems
    assert any(fnmatch.fnmatchcase(p, pattern) for p in problems), problems
    assert not out.exists()


def test_an_environment_error_is_merged_only_when_asked_and_then_said(tmp_path: Path) -> None:
    shards = write_episode_shards(tmp_path / "s", 2, held=records(errors=(3,)))
    out = tmp_path / "merged"
    with pytest.raises(MergeError, match=r"shard 2/2 \(.*\): environment error in 1 episode"):
        merge_episode_shards(shards, out)
    assert not out.exists()
    metrics = merge_episode_shards(shards, out, allow_env_errors=True)
    assert not metrics["complete"] and metrics["error_ids"] == ["twc-3"]
    assert metrics["episodes"]["errors"] == 1
    assert read_json(out / METRICS)["error_ids"] == ["twc-3"]


def test_a_run_that_is_not_a_merge_is_never_overwritten(tmp_path: Path) -> None:
    shards = write_episode_shards(tmp_path / "s", 2)
    out = write_episode_run(tmp_path / "whole")
    before = (out / METRICS).read_bytes()
    with pytest.raises(MergeError, match="already holds a run that is not a merge"):
        merge_episode_shards(shards, out)
    assert (out / METRICS).read_bytes() == before


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_merge_command_takes_episode_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = [str(p) for p in write_episode_shards(tmp_path / "s", 2)]
    out = str(tmp_path / "merged")
    assert cli_main(_args(shards[0], "-o", out)) == 1
    err = capsys.readouterr().err
    assert "refusing to merge, nothing written" in err and "missing shard(s): 2/2" in err
    assert cli_main(_args(*shards, "-o", out)) == 0
    assert "OK 2 episode shards" in capsys.readouterr().out
    assert read_json(Path(out) / METRICS)["complete"]


def test_slurm_check_shard_judges_an_episode_shard(tmp_path: Path) -> None:
    good = write_episode_shards(tmp_path / "good", 2)[1]
    verdict = check_shard(good, 2, 2, 1)
    assert verdict.code == 0 and "finished: 2 episode(s)" in verdict.line
    assert check_shard(good, 1, 2, 0).code == INCOMPLETE_EXIT  # another shard's directory
    broken = write_episode_shards(tmp_path / "err", 2, held=records(errors=(4,)))[1]
    verdict = check_shard(broken, 2, 2, 1)
    assert verdict.code == INCOMPLETE_EXIT and "environment error" in verdict.line


def test_a_shard_with_an_environment_error_is_not_promoted(tmp_path: Path) -> None:
    """The controller's promotion rule on metrics finalize_episode_run wrote."""
    errors = records(errors=(1,))
    shard = read_json(write_episode_run(tmp_path / "s", shard=(1, 2), held=errors) / METRICS)
    whole = read_json(write_episode_run(tmp_path / "w", held=errors) / METRICS)
    held = {k: v for k, v in records().items() if k != "twc-2"}
    partial = read_json(write_episode_run(tmp_path / "p", held=held) / METRICS)
    good = read_json(write_episode_shards(tmp_path / "g", 2)[0] / METRICS)
    assert [finished_run(m) for m in (shard, whole, partial, good)] == [False, True, False, True]
