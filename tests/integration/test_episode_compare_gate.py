"""Two real closed-loop runs (the demo checkpoint with its two adapters in TextWorld Express)
compared with ``memeval compare``, recounted, and gated: a failing gate and a passing one.

The two runs are made once for the module (each costs a model load and a JVM): run A under
``--memeval-min-success 1`` (no episode can succeed in two actions: the gate fails, exit 1),
run B against A as its baseline with a zero max drop and ``--memeval-min-success 0`` (the
gate passes, exit 0, although every episode item failed).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main

from .. import forkserver
from ..envs import require_textworld, twc_profile, write_pyproject


@dataclass(frozen=True)
class Runs:
    root: Path
    a: subprocess.CompletedProcess[str]
    b: subprocess.CompletedProcess[str]


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    python = forkserver.interpreter()
    return subprocess.run(
        [python.executable, "-m", "pytest", "-n", "0", *args],
        cwd=root,
        env=python.env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    require_textworld()
    root = tmp_path_factory.mktemp("episode_gate")
    write_pyproject(
        root,
        twc_profile("oracle", "0-2", adapter="oracle")
        + twc_profile("baseline", "0-2", adapter="baseline"),
    )
    a = _pytest(
        root, "--ckpt", "oracle", "--memeval-min-success", "1", "--memeval-summary-md", "a.md"
    )
    b = _pytest(
        root,
        "--ckpt",
        "baseline",
        "--memeval-baseline",
        "runs/oracle",
        "--memeval-max-drop",
        "0",
        "--memeval-min-success",
        "0%",
        "--memeval-summary-md",
        "b.md",
    )
    return Runs(root, a, b)


@pytest.mark.slow
def test_a_failing_gate_fails_the_session_and_a_passing_one_passes_it(runs: Runs) -> None:
    assert runs.a.returncode == 1, runs.a.stdout + runs.a.stderr
    assert "FAIL  success >= 100.00%: 0.00% (0/3), 100.00 pp below the threshold" in runs.a.stdout
    assert "gate FAILED: exit status 1" in runs.a.stdout
    assert runs.b.returncode == 0, runs.b.stdout + runs.b.stderr
    out = runs.b.stdout
    assert "3 failed" in out  # every episode failed: the gate, not the items, decides
    assert "PASS  success >= 0.00%: 0.00% (0/3)" in out
    assert "PASS  success drop vs baseline <= 0.00 pp: 0.00% vs 0.00% in " in out
    assert "3 episode failure(s) are episodes that did not succeed" in out
    assert "gate PASSED: exit status 0" in out
    # The job summary says what the gate decided, as it does for a scenario run.
    summary_a = (runs.root / "a.md").read_text("utf-8")
    assert "### Gate: ❌ FAILED (exit status 1)" in summary_a
    assert "- ❌ FAIL success \\>= 100.00%: 0.00% (0/3)" in summary_a  # Markdown-escaped
    summary_b = (runs.root / "b.md").read_text("utf-8")
    assert "### Gate: ✅ PASSED (exit status 0)" in summary_b


@pytest.mark.slow
def test_the_two_runs_compare_paired_by_episode_and_recount(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    run_a, run_b = runs.root / "runs" / "oracle", runs.root / "runs" / "baseline"
    assert main(["compare", str(run_a), str(run_b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "episodes" and result["n"] == 3
    assert (result["a"]["label"], result["b"]["label"]) == ("oracle", "baseline")
    assert result["env"]["game"] == "twc" and result["env"]["max_steps"] == 2
    predictions = {
        name: {
            r["id"]: r["success"]
            for r in map(json.loads, (d / "predictions.jsonl").read_text("utf-8").splitlines())
        }
        for name, d in (("a", run_a), ("b", run_b))
    }
    fixed = [i for i, ok in predictions["b"].items() if ok and not predictions["a"][i]]
    broken = [i for i, ok in predictions["a"].items() if ok and not predictions["b"][i]]
    assert result["flips"] == {"fixed": fixed, "broken": broken}
    assert result["mcnemar"]["discordant"] == len(fixed) + len(broken)
    assert main(["compare", str(run_a), str(run_b)]) == 0
    text = capsys.readouterr().out
    assert "twc" in text and "paired test on success (exact McNemar)" in text
    assert main(["recount", str(run_b)]) == 0
    assert "memeval recount: OK" in capsys.readouterr().out
