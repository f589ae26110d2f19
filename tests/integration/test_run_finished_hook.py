"""``pytest_memeval_run_finished``: a team's own publisher, in its ``conftest.py``, gets the
finished run once, on the controller, with and without xdist; one that raises is reported and
neither stops the others nor changes the exit status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..conftest import MemevalProject, demo_records
from ..runfactory import read_jsonl, write_crafted

TEAM_PLUGIN = """
import json
import os
from pathlib import Path


def pytest_memeval_run_finished(config, run):
    junit = Path("junit.xml")
    with Path("finished.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({
            "on_worker": hasattr(config, "workerinput"),
            "ckpt": run.ckpt,
            "label": run.label,
            "run_dir": str(run.run_dir),
            "complete": run.complete,
            "exitstatus": run.exitstatus,
            "gate": None if run.gate is None else run.gate.passed,
            "m1": [run.metrics["m1"]["correct"], run.metrics["m1"]["total"]],
            "kind": run.profile.kind,
            # pytest's junitxml wrote its file before this hook is called
            "junit_written": junit.is_file(),
        }) + "\\n")


class BrokenTracker:
    def pytest_memeval_run_finished(self, run):
        raise RuntimeError("tracker is down")


def pytest_configure(config):
    config.pluginmanager.register(BrokenTracker(), "team-broken-tracker")
"""


# Two runs each: outside the inner loop (the step summary's and JUnit's tests go through the
# same hook there).
@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["n0", "n2"])
def test_a_teams_publisher_gets_the_finished_run_once(
    memeval_project: MemevalProject, workers: list[str]
) -> None:
    recs = demo_records("baseline", 4)
    write_crafted(memeval_project, recs, wrong_final=[recs[0]["id"]])
    (memeval_project.path / "conftest.py").write_text(TEAM_PLUGIN, "utf-8")
    result = memeval_project.run(
        *workers, "--ckpt", "crafted", "--memeval-min-m1", "0.5", "--junitxml", "junit.xml"
    )
    assert result.ret == pytest.ExitCode.OK  # 3/4 passes the gate; the broken tracker is no failure
    result.stdout.fnmatch_lines(
        [
            "*memeval: pytest_memeval_run_finished of team-broken-tracker failed: "
            "RuntimeError: tracker is down (the run and the exit status are unaffected)*"
        ]
    )
    calls = read_jsonl(memeval_project.path / "finished.jsonl")
    assert calls == [
        {
            "on_worker": False,
            "ckpt": "crafted",
            "label": "crafted",
            "run_dir": str(memeval_project.run_dir("crafted")),
            "complete": True,
            "exitstatus": 0,
            "gate": True,
            "m1": [3, 4],
            "kind": "replay",
            "junit_written": True,
        }
    ]
    # A subset: the hook still runs (a CI summary reports it), saying it is incomplete.
    memeval_project.run(*workers, "--ckpt", "crafted", "-k", recs[1]["id"])
    subset: dict[str, Any] = read_jsonl(memeval_project.path / "finished.jsonl")[1]
    assert subset["complete"] is False and subset["exitstatus"] == 0
    assert subset["run_dir"] == str(memeval_project.latest_subset("crafted"))
    assert (
        json.loads((memeval_project.latest_subset("crafted") / "metrics.json").read_text())[
            "complete"
        ]
        is False
    )


@pytest.mark.slow
def test_no_run_written_no_call(memeval_project: MemevalProject) -> None:
    recs = demo_records("baseline", 2)
    write_crafted(memeval_project, recs)
    (memeval_project.path / "conftest.py").write_text(TEAM_PLUGIN, "utf-8")
    result = memeval_project.run("--ckpt", "crafted", "-k", "no_such_item")
    # Every eval item deselected: one line, exit 4, nothing written (own-project.md).
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*all 4 eval items were deselected*"])
    assert not (memeval_project.path / "finished.jsonl").exists()
