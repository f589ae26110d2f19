"""Closed-loop shards, for real: two shards of a profile's seeds, merged, are its unsharded run.

The tiny demo checkpoint acts in TextWorld Express (``twc``, ``max_steps`` 2): the unsharded
run, shard 1 (single process) and shard 2 (under xdist: the workers run the controller's
shard), ``memeval merge`` of the two, and a ``-k`` subset, which is written under
``subsets/<time>/`` and leaves the finished run at the top alone, then resumed to a finished
run promoted to the top. One test: each pytester run costs tens of CPU-seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.episode_records import recount_episodes
from pytest_memeval.tools.cli import main

from ..conftest import MemevalProject
from ..envs import require_textworld, twc_profile, write_pyproject


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


@pytest.mark.slow
def test_two_shards_merged_are_the_unsharded_run_and_a_subset_leaves_the_top_alone(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    require_textworld()
    write_pyproject(memeval_project.path, twc_profile("twc", "0-3"))
    memeval_project.run("--ckpt", "twc", "-n", "0").assert_outcomes(failed=4)
    top = memeval_project.run_dir("twc")
    unsharded = _lines(top / "predictions.jsonl")
    assert [r["id"] for r in unsharded] == ["twc-0", "twc-1", "twc-2", "twc-3"]

    first = memeval_project.run("--ckpt", "twc", "-n", "0", "--memeval-shard", "1/2", "-v")
    first.assert_outcomes(failed=2)
    first.stdout.fnmatch_lines(
        ["*2 episode(s) (shard 1/2 of 4)*", "*shard 1/2: episodes twc-0 ..*"]
    )
    second = memeval_project.run("--ckpt", "twc", "-n", "2", "--memeval-shard", "2/2")
    second.assert_outcomes(failed=2)
    shards = [top / "shard-1-of-2", top / "shard-2-of-2"]
    for k, shard in enumerate(shards, start=1):
        metrics = json.loads((shard / "metrics.json").read_text("utf-8"))
        assert metrics["scope"]["shard"]["spec"] == f"{k}/2" and not metrics["complete"]
        assert metrics["missing"] == [] and metrics["error_ids"] == []
    assert [r["id"] for r in _lines(shards[1] / "predictions.jsonl")] == ["twc-2", "twc-3"]

    out = tmp_path / "merged"
    assert main(["merge", *map(str, shards), "-o", str(out)]) == 0
    assert _lines(out / "predictions.jsonl") == unsharded
    merged = json.loads((out / "metrics.json").read_text("utf-8"))
    assert merged["complete"] and recount_episodes(out / "predictions.jsonl", merged) == []
    whole = memeval_project.metrics("twc")
    assert merged["episodes"] == whole["episodes"] and merged["slices"] == whole["slices"]
    assert merged["fingerprints"] == whole["fingerprints"]

    before = {name: (top / name).read_bytes() for name in ("metrics.json", "predictions.jsonl")}
    subset = memeval_project.run("--ckpt", "twc", "-n", "0", "-k", "twc-3")
    subset.assert_outcomes(failed=1, deselected=3)
    subset.stdout.fnmatch_lines(["*not finished: written under*subsets*"])
    assert {name: (top / name).read_bytes() for name in before} == before
    partial = memeval_project.subset_metrics("twc")
    assert partial["missing"] == ["twc-0", "twc-1", "twc-2"] and not partial["complete"]
    assert [
        r["id"] for r in _lines(memeval_project.latest_subset("twc") / "predictions.jsonl")
    ] == ["twc-3"]
    # Resumed, the subset run is continued in place, finished and promoted: the top holds
    # every episode again, and the run it replaced is kept in previous/.
    resumed = memeval_project.run("--ckpt", "twc", "-n", "0", "--memeval-resume")
    resumed.assert_outcomes(failed=3, deselected=1)
    assert _lines(top / "predictions.jsonl") == unsharded
    assert memeval_project.metrics("twc")["complete"]
    assert (top / "previous" / "predictions.jsonl").read_bytes() == before["predictions.jsonl"]
    assert memeval_project.subsets("twc") == []
