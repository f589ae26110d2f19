"""Load: many scenarios under ``-n 2``, records streamed to the journal and held nowhere.

The 5,000-scenario measurement through the real model is in ``docs/robustness.md`` (it takes
minutes); this is its cheap CI variant: a few hundred scenarios through the replay decoder
(no model), checking that the run completes and recounts exactly, and that at the end no
process still holds the records: the workers' record caches are empty and none of the
reports pytest keeps on the controller carries a record.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_memeval.core.recount import recount_run
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY

from ..conftest import MemevalProject, demo_records, write_jsonl

# Slow: one long run of many scenarios under -n 2.
pytestmark = pytest.mark.slow

COPIES = 1  # x the demo validation set (189 scenarios): cheap enough for CI

PROBE_CONFTEST = """
import json
import os

from pytest_memeval.compat.pytest import report_record


def pytest_sessionfinish(session):
    root = session.config.rootpath
    who = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    worker = session.config.pluginmanager.get_plugin("memeval-worker")
    if worker is not None:
        (root / f"probe-cache-{who}.json").write_text(json.dumps(len(worker._records)))
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        reports = [r for reps in tr.stats.values() for r in reps if hasattr(r, "nodeid")]
        held = sum(report_record(r) is not None for r in reports)
        (root / f"probe-reports-{who}.json").write_text(json.dumps([len(reports), held]))
"""


def _replay_source(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored outputs for the replay decoder: every output is the ground truth."""
    out = []
    for r in records:
        said = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        chain = r.get("memory_chain")
        turns = chain if chain is not None and len(chain) == len(said) - 1 else said[:-1]
        out.append(
            {
                "id": r["id"],
                "turns": [{"pred": text, "stopped": True} for text in turns],
                "final_pred": said[-1],
                "final_stopped": True,
                "prompt_tail": "",
            }
        )
    return out


def test_hundreds_of_scenarios_stream_through_and_recount(memeval_project: MemevalProject) -> None:
    base = demo_records("oracle", 10_000)
    records = [{**r, "id": f"{r['id']}-{copy}"} for copy in range(COPIES) for r in base]
    n = len(records)
    memeval_project.write(
        records,
        profiles="""
        [tool.memeval.ckpt.load]
        kind = "replay"
        predictions = "stored.jsonl"
        benchmark = "bench.jsonl"
        """,
    )
    write_jsonl(memeval_project.path / "stored.jsonl", _replay_source(records))
    memeval_project.pytester.makeconftest(PROBE_CONFTEST)

    result = memeval_project.run("--ckpt", "load", "-n", "2", "-q")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"ckpt load: {n} scenarios (complete)"])

    run_dir = memeval_project.run_dir("load")
    assert recount_run(run_dir)["n"] == n
    metrics = memeval_project.metrics("load")
    assert metrics["complete"] is True and metrics["m1"]["correct"] == n
    assert [p["id"] for p in memeval_project.predictions("load")] == [r["id"] for r in records]
    lines = (run_dir / "journal.jsonl").read_text("utf-8").splitlines()
    assert JOURNAL_HEADER_KEY in json.loads(lines[0]) and len(lines) == n + 1

    # Nothing holds every record: worker caches drained, controller reports stripped.
    caches = {
        p.name: json.loads(p.read_text("utf-8"))
        for p in memeval_project.path.glob("probe-cache-gw*.json")
    }
    assert len(caches) >= 2 and set(caches.values()) == {0}, caches
    kept, held = json.loads(
        (memeval_project.path / "probe-reports-controller.json").read_text("utf-8")
    )
    assert kept >= 2 * n and held == 0
    worker_probes = sorted(memeval_project.path.glob("probe-reports-gw*.json"))
    assert len(worker_probes) >= 2  # workers keep their reports too, in their own reporter
    for probe in worker_probes:
        assert json.loads(probe.read_text("utf-8"))[1] == 0, probe.name
