"""A run reuses the fast path's calibration that an earlier run (or another worker of the same
run) stored in the cache directory, says so in its summary and metrics, and measures it again
when asked or when its entry is damaged (real demo model, pytest runs as a user runs them).

The plain (no xdist) runs are one user's sequence over one project and one cache directory,
made once for the module (:func:`plain_runs`): a first run that measures, a second that reuses,
a run with a changed key and one with ``--memeval-recalibrate`` that measure again; then, with
the cache directory set by the ini key alone, a run over the damaged entry and one with
``memeval_recalibrate = true``. The two tests of plain runs each check their part of it, as
they did when each made its own runs. The one run no longer made is the ini test's first, on
an empty cache: the same measurement as the plain first run's. That the ini key names the
cache directory is shown by the damaged run and the ini recalibration, which find the entry
there and replace it (the default directory, in the project's HOME, holds nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .. import forkserver
from ..conftest import MemevalProject, demo_records, write_project

pytestmark = pytest.mark.slow

#: Scenarios of the plain runs (the xdist test's own run has six, some for each worker).
N = 3


def _calibration(project: MemevalProject) -> dict[str, Any]:
    block: dict[str, Any] = project.metrics()["timing"]["calibration"]
    return block


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "calibration").glob("*.json"))


def _stored_run(entry: Path) -> str | None:
    """The run that stored ``entry``; ``None`` for an entry that cannot be read (damaged)."""
    try:
        return str(json.loads(entry.read_text("utf-8"))["run"])
    except (ValueError, KeyError):
        return None


@dataclass(frozen=True)
class Run:
    """One pytest run of the sequence, and what it left in the run and cache directories."""

    ret: int
    stdout: str
    #: ``metrics.json``'s ``timing.calibration`` block
    calibration: dict[str, Any]
    #: (id, turns, final_pred) of each record, in the file's order
    outputs: list[Any]
    #: the cache's entries after the run, each with the run that stored it
    stored: dict[Path, str | None]

    def fnmatch_lines(self, lines: list[str]) -> None:
        pytest.LineMatcher(self.stdout.splitlines()).fnmatch_lines(lines)


@dataclass(frozen=True)
class PlainRuns:
    cache: Path
    #: a first run, a second reusing its entry
    first: Run
    reuse: Run
    #: a changed key (max_new_tokens), then ``--memeval-recalibrate``
    changed_key: Run
    recalibrated: Run
    #: the cache directory from the ini key: the entry damaged, then ``memeval_recalibrate``
    damaged: Run
    damaged_entry_text: str
    ini_recalibrated: Run


def _run(root: Path, cache: Path, *args: str) -> Run:
    # As pytester runs it (conftest's ``memeval_project``): HOME in the project, so that the
    # default cache directory is the project's own, outer options and colours off.
    env = {**os.environ, "HOME": str(root), "USERPROFILE": str(root), "PY_COLORS": "0"}
    env.pop("PYTEST_ADDOPTS", None)
    python = forkserver.interpreter(env)
    proc = subprocess.run(
        [python.executable, "-m", "pytest", "--ckpt", "demo", *args],
        cwd=root,
        env=python.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    run_dir = root / "runs" / "demo"
    metrics_file = run_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text("utf-8")) if metrics_file.is_file() else {}
    preds_file = run_dir / "predictions.jsonl"
    preds = [json.loads(x) for x in preds_file.read_text("utf-8").splitlines() if x.strip()]
    return Run(
        ret=proc.returncode,
        stdout=proc.stdout + proc.stderr,
        calibration=metrics.get("timing", {}).get("calibration", {}),
        outputs=[(r["id"], r["turns"], r["final_pred"]) for r in preds],
        stored={entry: _stored_run(entry) for entry in _entries(cache)},
    )


@pytest.fixture(scope="module")
def plain_runs(tmp_path_factory: pytest.TempPathFactory) -> PlainRuns:
    """The sequence, run once: each step's output and what the cache held after it."""
    root = tmp_path_factory.mktemp("calibration-reuse")
    cache = root / "cache"
    write_project(root, demo_records("oracle", N))
    opt = ("--memeval-cache-dir", str(cache))
    first = _run(root, cache, *opt)
    reuse = _run(root, cache, f"--memeval-cache-dir={cache}")  # the '=' spelling
    changed_key = _run(root, cache, *opt, "--memeval-set", "generation.max_new_tokens=12")
    recalibrated = _run(root, cache, *opt, "--memeval-recalibrate")

    # From here the cache directory comes from the ini key alone.
    (entry,) = first.stored
    entry.write_text('{"format": 1, "key": ', "utf-8")  # cut short
    ini = f'memeval_cache_dir = "{cache.as_posix()}"'
    write_project(root, demo_records("oracle", N), ini=ini)
    damaged = _run(root, cache)
    damaged_entry_text = entry.read_text("utf-8")
    write_project(root, demo_records("oracle", N), ini=ini + "\nmemeval_recalibrate = true")
    ini_recalibrated = _run(root, cache)
    return PlainRuns(
        cache,
        first,
        reuse,
        changed_key,
        recalibrated,
        damaged,
        damaged_entry_text,
        ini_recalibrated,
    )


def test_a_second_run_reuses_the_calibration_and_recalibrating_measures_again(
    plain_runs: PlainRuns,
) -> None:
    cache, first = plain_runs.cache, plain_runs.first
    first.fnmatch_lines([f"calibration: measured (*s); stored in {cache}/calibration/*"])
    assert first.calibration["measured"] == 1
    (entry,) = first.stored
    measured_by, outputs = first.stored[entry], first.outputs

    second = plain_runs.reuse
    second.fnmatch_lines(["calibration: reused (measured by an earlier run); stored in *"])
    block = second.calibration
    assert (block["measured"], block["reused"], block["measure_s"]) == (0, 1, 0.0)
    assert block["entries"] == [str(entry)]
    assert second.stored == {entry: measured_by}  # untouched
    assert second.outputs == outputs

    # A changed key (here max_new_tokens) measures again, into a new entry.
    changed = plain_runs.changed_key
    changed.fnmatch_lines(["calibration: measured (*"])
    assert len(changed.stored) == 2

    # --memeval-recalibrate: measured again, the entry replaced.
    again = plain_runs.recalibrated
    again.fnmatch_lines(["calibration: measured (*"])
    assert again.stored[entry] != measured_by and len(again.stored) == 2
    assert again.outputs == outputs


def test_the_ini_key_recalibrates_and_a_damaged_entry_is_measured_again(
    plain_runs: PlainRuns,
) -> None:
    cache, (entry,) = plain_runs.cache, plain_runs.first.stored
    damaged = plain_runs.damaged
    # The warning (pytest's warnings summary), then the memeval summary: measured again into
    # the cache directory the ini key names.
    damaged.fnmatch_lines(
        [
            "*CalibrationCacheWarning: the stored calibration *could not be used "
            "(JSONDecodeError*measured again and replaced",
            f"calibration: measured (*s); stored in {cache}/calibration/*",
        ]
    )
    assert damaged.ret == 1  # the demo's wrong answers; the run itself is whole
    assert damaged.outputs == plain_runs.first.outputs
    json.loads(plain_runs.damaged_entry_text)  # replaced by a whole entry

    # The ini key memeval_recalibrate: measured again, the entry replaced.
    again = plain_runs.ini_recalibrated
    again.fnmatch_lines([f"calibration: measured (*s); stored in {cache}/calibration/*"])
    run = damaged.stored[entry]
    assert run is not None and again.stored[entry] != run


def test_under_xdist_one_worker_measures_and_the_other_reuses(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    memeval_project.write(n=6)
    cache = tmp_path / "cache"
    result = memeval_project.run("--ckpt", "demo", "-n", "2", "--memeval-cache-dir", str(cache))
    workers = {r["worker"] for r in memeval_project.predictions()}
    assert workers == {"gw0", "gw1"}, result.stdout.str()
    block = _calibration(memeval_project)
    # Counted from what each worker reported, and from the cache: one entry, one measurement.
    assert (block["measured"], block["reused"]) == (1, 1)
    (entry,) = _entries(cache)
    assert block["entries"] == [str(entry)]
    result.stdout.fnmatch_lines(["calibration: measured by 1 process (*s), reused by 1; stored*"])
    # A second -n 2 run: both workers reuse it.
    memeval_project.run("--ckpt", "demo", "-n", "2", "--memeval-cache-dir", str(cache))
    block = _calibration(memeval_project)
    assert (block["measured"], block["reused"]) == (0, 2) and _entries(cache) == [entry]
