"""A run reuses the fast path's calibration that an earlier run (or another worker of the same
run) stored in the cache directory, says so in its summary and metrics, and measures it again
when asked or when its entry is damaged (real demo model, pytest runs as a user runs them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..conftest import MemevalProject

pytestmark = pytest.mark.slow


def _calibration(project: MemevalProject) -> dict[str, Any]:
    block: dict[str, Any] = project.metrics()["timing"]["calibration"]
    return block


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "calibration").glob("*.json"))


def _stored_run(entry: Path) -> str:
    return str(json.loads(entry.read_text("utf-8"))["run"])


def _outputs(project: MemevalProject) -> list[Any]:
    return [(r["id"], r["turns"], r["final_pred"]) for r in project.predictions()]


def test_a_second_run_reuses_the_calibration_and_recalibrating_measures_again(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    memeval_project.write(n=3)
    cache = tmp_path / "cache"
    first = memeval_project.run("--ckpt", "demo", "--memeval-cache-dir", str(cache))
    first.stdout.fnmatch_lines([f"calibration: measured (*s); stored in {cache}/calibration/*"])
    assert _calibration(memeval_project)["measured"] == 1
    (entry,) = _entries(cache)
    measured_by, outputs = _stored_run(entry), _outputs(memeval_project)

    second = memeval_project.run("--ckpt", "demo", f"--memeval-cache-dir={cache}")
    second.stdout.fnmatch_lines(["calibration: reused (measured by an earlier run); stored in *"])
    block = _calibration(memeval_project)
    assert (block["measured"], block["reused"], block["measure_s"]) == (0, 1, 0.0)
    assert block["entries"] == [str(entry)]
    assert _entries(cache) == [entry] and _stored_run(entry) == measured_by  # untouched
    assert _outputs(memeval_project) == outputs

    # A changed key (here max_new_tokens) measures again, into a new entry.
    changed = memeval_project.run(
        "--ckpt", "demo", "--memeval-cache-dir", str(cache),
        "--memeval-set", "generation.max_new_tokens=12",
    )  # fmt: skip
    changed.stdout.fnmatch_lines(["calibration: measured (*"])
    assert len(_entries(cache)) == 2

    # --memeval-recalibrate: measured again, the entry replaced.
    again = memeval_project.run(
        "--ckpt", "demo", "--memeval-cache-dir", str(cache), "--memeval-recalibrate"
    )
    again.stdout.fnmatch_lines(["calibration: measured (*"])
    assert _stored_run(entry) != measured_by and len(_entries(cache)) == 2
    assert _outputs(memeval_project) == outputs


def test_the_ini_key_recalibrates_and_a_damaged_entry_is_measured_again(
    memeval_project: MemevalProject, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    memeval_project.write(n=3, ini=f'memeval_cache_dir = "{cache.as_posix()}"')
    memeval_project.run("--ckpt", "demo").stdout.fnmatch_lines(["calibration: measured (*"])
    (entry,) = _entries(cache)
    outputs = _outputs(memeval_project)
    entry.write_text('{"format": 1, "key": ', "utf-8")  # cut short
    damaged = memeval_project.run("--ckpt", "demo")
    # The warning (pytest's warnings summary), then the memeval summary.
    damaged.stdout.fnmatch_lines(
        [
            "*CalibrationCacheWarning: the stored calibration *could not be used "
            "(JSONDecodeError*measured again and replaced",
            "calibration: measured (*",
        ]
    )
    assert damaged.ret == 1  # the demo's wrong answers; the run itself is whole
    assert _outputs(memeval_project) == outputs
    json.loads(entry.read_text("utf-8"))  # replaced by a whole entry

    memeval_project.write(
        n=3, ini=f'memeval_cache_dir = "{cache.as_posix()}"\nmemeval_recalibrate = true'
    )
    run = _stored_run(entry)
    memeval_project.run("--ckpt", "demo").stdout.fnmatch_lines(["calibration: measured (*"])
    assert _stored_run(entry) != run


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
