"""Closed-loop runs of one profile, for real: serial and under xdist, sharded and merged.

The tiny demo checkpoint acts in TextWorld Express (``twc``, ``max_steps`` 2). One unsharded
serial run of seeds 0-3 is made once for the module and read by both tests: it is the run two
shards merged must equal (shard 1 in a single process, shard 2 under xdist: the workers run
the controller's shard, then ``memeval merge``, then a ``-k`` subset written under
``subsets/<time>/`` that leaves the finished run at the top alone and is resumed to a finished
run promoted to the top), and the serial run (fast path) whose trajectories a ``-n 2`` run
of the same checkpoint on the reference path must give again. Each pytest run costs tens of
CPU-seconds (a model load, a JVM): sharing the serial run saves one.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.episode_records import recount_episodes
from pytest_memeval.tools.cli import main

from ..envs import no_jvm_left, require_textworld, twc_profile, write_pyproject
from ..moduleruns import run_pytest

pytestmark = pytest.mark.slow


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


@dataclass
class Project:
    """A closed-loop project made once for the module (pytester's is per test); each run in
    it is marked with ``MEMEVAL_TEST_RUN_MARK`` in its environment (the JVMs inherit it)."""

    path: Path
    mark: str

    def run(self, *args: str) -> pytest.RunResult:
        return run_pytest(self.path, *args, env={"MEMEVAL_TEST_RUN_MARK": self.mark})

    @property
    def top(self) -> Path:
        return self.path / "runs" / "twc"

    def metrics(self, ckpt: str = "twc") -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            (self.path / "runs" / ckpt / "metrics.json").read_text("utf-8")
        )
        return data

    def subsets(self) -> list[Path]:
        base = self.top / "subsets"
        return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


@dataclass(frozen=True)
class Unsharded:
    """The module's serial run of ``twc`` (seeds 0-3), as it was when it finished."""

    project: Project
    predictions: list[dict[str, Any]]
    metrics: dict[str, Any]
    files: dict[str, bytes]


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory) -> Unsharded:
    require_textworld()
    project = Project(tmp_path_factory.mktemp("episode-runs"), uuid.uuid4().hex)
    # "b": the same checkpoint and seeds under another name, for the -n 2 run.
    write_pyproject(project.path, twc_profile("twc", "0-3") + twc_profile("b", "0-3"))
    project.run("--ckpt", "twc", "-n", "0").assert_outcomes(failed=4)
    no_jvm_left(project.mark)
    names = ("metrics.json", "predictions.jsonl")
    return Unsharded(
        project,
        _lines(project.top / "predictions.jsonl"),
        project.metrics(),
        {name: (project.top / name).read_bytes() for name in names},
    )


def test_two_shards_merged_are_the_unsharded_run_and_a_subset_leaves_the_top_alone(
    unsharded: Unsharded, tmp_path: Path
) -> None:
    project, top = unsharded.project, unsharded.project.top
    assert [r["id"] for r in unsharded.predictions] == ["twc-0", "twc-1", "twc-2", "twc-3"]

    first = project.run("--ckpt", "twc", "-n", "0", "--memeval-shard", "1/2", "-v")
    first.assert_outcomes(failed=2)
    first.stdout.fnmatch_lines(
        ["*2 episode(s) (shard 1/2 of 4)*", "*shard 1/2: episodes twc-0 ..*"]
    )
    second = project.run("--ckpt", "twc", "-n", "2", "--memeval-shard", "2/2")
    second.assert_outcomes(failed=2)
    shards = [top / "shard-1-of-2", top / "shard-2-of-2"]
    for k, shard in enumerate(shards, start=1):
        metrics = json.loads((shard / "metrics.json").read_text("utf-8"))
        assert metrics["scope"]["shard"]["spec"] == f"{k}/2" and not metrics["complete"]
        assert metrics["missing"] == [] and metrics["error_ids"] == []
    assert [r["id"] for r in _lines(shards[1] / "predictions.jsonl")] == ["twc-2", "twc-3"]

    out = tmp_path / "merged"
    assert main(["merge", *map(str, shards), "-o", str(out)]) == 0
    assert _lines(out / "predictions.jsonl") == unsharded.predictions
    merged = json.loads((out / "metrics.json").read_text("utf-8"))
    assert merged["complete"] and recount_episodes(out / "predictions.jsonl", merged) == []
    whole = unsharded.metrics
    assert merged["episodes"] == whole["episodes"] and merged["slices"] == whole["slices"]
    assert merged["fingerprints"] == whole["fingerprints"]

    before = unsharded.files
    assert {name: (top / name).read_bytes() for name in before} == before  # shards: beside it
    subset = project.run("--ckpt", "twc", "-n", "0", "-k", "twc-3")
    subset.assert_outcomes(failed=1, deselected=3)
    subset.stdout.fnmatch_lines(["*not finished: written under*subsets*"])
    assert {name: (top / name).read_bytes() for name in before} == before
    assert project.subsets(), f"no unfinished run under {top / 'subsets'}"
    latest = project.subsets()[-1]
    partial = json.loads((latest / "metrics.json").read_text("utf-8"))
    assert partial["missing"] == ["twc-0", "twc-1", "twc-2"] and not partial["complete"]
    assert [r["id"] for r in _lines(latest / "predictions.jsonl")] == ["twc-3"]
    # Resumed, the subset run is continued in place, finished and promoted: the top holds
    # every episode again, and the run it replaced is kept in previous/.
    resumed = project.run("--ckpt", "twc", "-n", "0", "--memeval-resume")
    resumed.assert_outcomes(failed=3, deselected=1)
    assert _lines(top / "predictions.jsonl") == unsharded.predictions
    assert project.metrics()["complete"]
    assert (top / "previous" / "predictions.jsonl").read_bytes() == before["predictions.jsonl"]
    assert project.subsets() == []


def test_the_fast_serial_run_and_the_reference_under_xdist_give_identical_trajectories(
    unsharded: Unsharded,
) -> None:
    """The module's serial run of ``twc`` (the fast path: the four episodes stepped together,
    caches kept) and a ``-n 2`` run of ``b`` (the same checkpoint, generation and seeds) on
    the reference path: each worker plays its episodes one at a time, a whole ``generate``
    per step, in its one environment."""
    project = unsharded.project
    spread = project.run("--ckpt", "b", "-n", "2", "--memeval-decode", "reference")
    spread.assert_outcomes(failed=4)
    serial = {r["id"]: r["trajectory"] for r in unsharded.predictions}
    spread_records = _lines(project.path / "runs" / "b" / "predictions.jsonl")
    assert {r["id"]: r["trajectory"] for r in spread_records} == serial
    assert project.metrics("b")["episodes"] == unsharded.metrics["episodes"]
    no_jvm_left(project.mark)
