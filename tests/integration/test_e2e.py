"""End to end: pytester projects evaluating the real demo checkpoint, with and without xdist.

The serial demo-model run is made once for the module (:func:`shared`): the serial half of
the serial/xdist comparison, the full run a subset run was written beside, and the stored
outputs the replay profiles re-score. Each test's other runs go to run directories of their
own in that project, so the tests do not depend on each other's order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from pytest_memeval.core.recount import recount_run

from ..conftest import MemevalProject, demo_records, write_project
from ..moduleruns import run_pytest
from ..runfactory import content, read_jsonl

#: Aligned (oracle) and unaligned (baseline) scenarios of the demo benchmark.
RECORDS = demo_records("oracle", 3) + demo_records("baseline", 5)[3:]
#: The two scenarios the subset run selects.
SUBSET = (RECORDS[0]["id"], RECORDS[1]["id"])

STRICT_PROFILE = """
[tool.memeval.ckpt.strict]
kind = "replay"
predictions = "runs/demo/predictions.jsonl"
benchmark = "bench.jsonl"
parse = { final = "zzz", turn = "zzz" }
"""


def _run(root: Path, *args: str) -> pytest.RunResult:
    """``pytest args`` in a subprocess in ``root``, as ``Pytester.runpytest_subprocess`` runs
    it (:func:`tests.moduleruns.run_pytest`)."""
    return run_pytest(root, *args, timeout=600)


@dataclass(frozen=True)
class Shared:
    """The module's project and what its two shared runs left."""

    root: Path
    subset: pytest.RunResult  # ``-k`` of two scenarios, before any finished run
    top_after_subset: bool  # whether runs/demo held a metrics.json right after it
    subset_metrics: dict[str, Any]
    serial: pytest.RunResult  # the full serial run into runs/demo
    serial_junit: Path
    full: dict[str, Any]  # its metrics.json
    predictions: bytes  # its predictions.jsonl

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / "demo"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Shared:
    """A subset run, then the full serial run of the demo model into the same run directory
    (where the subset run was written beside it); made once for the module."""
    root = tmp_path_factory.mktemp("e2e")
    write_project(root, RECORDS, profiles=STRICT_PROFILE)
    run_dir = root / "runs" / "demo"
    subset = _run(root, "--ckpt", "demo", "-k", " or ".join(SUBSET))
    subsets = sorted(p for p in (run_dir / "subsets").iterdir() if p.is_dir())
    assert subsets, subset.stdout.str()
    subset_metrics = json.loads((subsets[-1] / "metrics.json").read_text("utf-8"))
    top_after_subset = (run_dir / "metrics.json").exists()
    junit = root / "serial.xml"
    serial = _run(
        root, "--ckpt", "demo", "--memeval-out", str(run_dir), "-rx", f"--junitxml={junit}"
    )
    assert (run_dir / "metrics.json").is_file(), serial.stdout.str()[-3000:] + serial.stderr.str()
    return Shared(
        root=root,
        subset=subset,
        top_after_subset=top_after_subset,
        subset_metrics=subset_metrics,
        serial=serial,
        serial_junit=junit,
        full=json.loads((run_dir / "metrics.json").read_text("utf-8")),
        predictions=(run_dir / "predictions.jsonl").read_bytes(),
    )


@pytest.mark.slow
def test_without_ckpt_eval_items_say_why_they_skip(memeval_project: MemevalProject) -> None:
    memeval_project.write(n=2)
    result = memeval_project.run("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*no --ckpt given: eval items need a checkpoint profile*"])
    assert not memeval_project.run_dir().exists()


@pytest.mark.slow
def test_unknown_ckpt_is_a_usage_error_listing_profiles(memeval_project: MemevalProject) -> None:
    memeval_project.write(n=2)
    result = memeval_project.run("--ckpt", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown --ckpt 'nope'*known: base, demo, replay*"])


@pytest.mark.slow
def test_no_xdist_and_two_workers_give_identical_runs(shared: Shared) -> None:
    records = RECORDS
    n_unaligned = sum(
        1
        for r in records
        if len(r["memory_chain"]) != sum(m["role"] == "assistant" for m in r["messages"]) - 1
    )
    assert 0 < n_unaligned < len(records), "the fixture must mix aligned and unaligned scenarios"

    xdist_out = shared.root / "runs" / "xdist"
    xdist_junit = shared.root / "xdist.xml"
    xdist = _run(
        shared.root,
        "--ckpt",
        "demo",
        "--memeval-out",
        str(xdist_out),
        "-rx",
        f"--junitxml={xdist_junit}",
        "-n",
        "2",
    )
    runs = {}
    for label, result, out, junit in (
        ("serial", shared.serial, shared.run_dir, shared.serial_junit),
        ("xdist", xdist, xdist_out, xdist_junit),
    ):
        outcomes = result.parseoutcomes()
        # Every scenario: one final-query item; every turns item is xfail iff unaligned.
        assert outcomes.get("xfailed", 0) == n_unaligned
        assert (
            outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2 * len(records) - n_unaligned
        )
        result.stdout.fnmatch_lines(
            [
                "*= memeval =*",
                "ckpt demo: 5 scenarios (complete)",
                "m1 final-query: */5 = *%",
                "m2 turn-level: * (aligned scenarios only)",
                f"unaligned: {n_unaligned}/5   parse failures: final *, turns *",
                "throughput: * scenarios/s*",
            ]
        )
        result.stdout.fnmatch_lines(
            ["*XFAIL*test_turns*turn structure unaligned with ground truth*"]
        )
        assert recount_run(out)["n"] == 5
        metrics = json.loads((out / "metrics.json").read_text("utf-8"))
        assert metrics["complete"] is True and metrics["missing"] == []
        assert metrics["scope"]["subset"] is False
        assert set(metrics["fingerprints"]) == {"benchmark", "model", "adapter", "decoding"}
        assert all(v and v.startswith("sha256:") for v in metrics["fingerprints"].values())
        predictions = read_jsonl(out / "predictions.jsonl")
        assert [p["id"] for p in predictions] == [r["id"] for r in records]
        # m1 in the metrics is exactly what the final-query items asserted.
        cases = ElementTree.parse(junit).getroot().iter("testcase")
        finals = [c for c in cases if c.get("name", "").startswith("test_final_query[")]
        assert len(finals) == len(records)
        passed = sum(1 for c in finals if c.find("failure") is None and c.find("error") is None)
        assert metrics["m1"]["correct"] == passed
        runs[label] = (metrics, predictions)

    (m_serial, p_serial), (m_xdist, p_xdist) = runs["serial"], runs["xdist"]
    assert content(p_serial) == content(p_xdist)
    assert {p["worker"] for p in p_xdist} <= {"gw0", "gw1"}
    for key in ("n", "m1", "m2", "unaligned", "parse_fail", "fingerprints"):
        assert m_serial[key] == m_xdist[key], key


@pytest.mark.slow
def test_subset_runs_say_so_and_replay_rescores(shared: Shared) -> None:
    records, total = RECORDS, len(RECORDS)
    shared.subset.stdout.fnmatch_lines(
        [f"subset run: 2 of {total} scenarios selected (metrics say complete: false)"]
    )
    metrics = shared.subset_metrics  # not finished: beside the (then absent) full run
    assert not shared.top_after_subset
    assert metrics["complete"] is False and metrics["n"] == 2
    assert metrics["scope"] == {
        **metrics["scope"],
        "subset": True,
        "evaluated": 2,
        "in_scope": total,
    }
    assert sorted(metrics["not_selected"]) == sorted(r["id"] for r in records[2:])
    assert metrics["missing"] == []

    full = shared.full  # the full run made after it, into the same run directory
    assert full["complete"] is True
    # --collect-only evaluates nothing on purpose: the finished run stays as it was.
    _run(shared.root, "--ckpt", "demo", "--collect-only", "-n", "2")
    assert json.loads((shared.run_dir / "metrics.json").read_text("utf-8")) == full
    assert (shared.run_dir / "predictions.jsonl").read_bytes() == shared.predictions
    # Replay: the stored outputs re-scored without a model give the same counts...
    replayed = _run(shared.root, "--ckpt", "replay", "-n", "2")
    replayed.stdout.fnmatch_lines([f"ckpt replay: {total} scenarios (complete)"])
    again = json.loads((shared.root / "runs" / "replay" / "metrics.json").read_text("utf-8"))
    for key in ("n", "m1", "m2", "unaligned", "parse_fail"):
        assert again[key] == full[key], key
    assert again["fingerprints"]["model"] == full["fingerprints"]["model"]
    assert again["decoding"]["path"] == "replay"


@pytest.mark.slow
def test_replay_applies_a_new_matching_rule(shared: Shared) -> None:
    """The ``strict`` replay profile re-scores the demo run's stored outputs (``shared``)."""
    result = _run(shared.root, "--ckpt", "strict")
    strict = shared.root / "runs" / "strict"
    metrics = json.loads((strict / "metrics.json").read_text("utf-8"))
    assert metrics["m1"]["correct"] == 0 and metrics["parse_fail"]["final"] == len(RECORDS)
    assert metrics["parse_fail"]["turns"] == sum(
        len(p["turns"]) for p in read_jsonl(strict / "predictions.jsonl")
    )
    result.stdout.fnmatch_lines(["*PARSE FAILURE (does not match the final pattern 'zzz')*"])
