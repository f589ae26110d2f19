"""memeval merge: shard runs -> one run, only when they make exactly one complete run."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core import results as results_module
from pytest_memeval.core.metrics import Tally
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.core.runlayout import new_subset_dir
from pytest_memeval.core.runlock import RunLock
from pytest_memeval.runtime.summary import format_summary
from pytest_memeval.tools import merge as merge_module
from pytest_memeval.tools.cli import main

from ..conftest import ADAPTERS, BASE_MODEL, MemevalProject, demo_records
from ..runfactory import COUNT_FIELDS, FINGERPRINTS, content, read_jsonl, write_shard
from ..runfactory import SHARD_IDS as IDS


def merge(*args: object) -> int:
    """``memeval merge ARGS...``, in process."""
    return main(["merge", *map(str, args)])


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    """Shards 1/3 .. 3/3 of a 7-scenario benchmark (sizes 3, 2, 2)."""
    return [write_shard(tmp_path / f"shard-{k}", IDS, k, 3) for k in (1, 2, 3)]


def edit_metrics(run_dir: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = run_dir / "metrics.json"
    metrics = json.loads(path.read_text("utf-8"))
    change(metrics)
    path.write_text(json.dumps(metrics), "utf-8")


def test_merge_of_complete_shards(
    shards: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged"
    # Given in any order: the merge orders by shard number.
    assert merge(shards[2], shards[0], shards[1], "-o", out) == 0
    assert "memeval merge: OK 3 shards" in capsys.readouterr().out
    records = read_jsonl(out / "predictions.jsonl")
    assert [r["id"] for r in records] == IDS
    assert [r["index"] for r in records] == list(range(7))
    recount_run(out)
    metrics = json.loads((out / "metrics.json").read_text("utf-8"))
    expected = Tally().extend(r for s in shards for r in read_jsonl(s / "predictions.jsonl"))
    assert {k: metrics[k] for k in ("n", "m1", "m2")} == {
        k: expected.counts()[k] for k in ("n", "m1", "m2")
    }
    assert metrics["complete"] is True
    assert metrics["missing"] == [] and metrics["scope"]["shard"] is None
    assert metrics["scope"]["evaluated"] == metrics["scope"]["benchmark_total"] == 7
    assert metrics["fingerprints"] == FINGERPRINTS
    assert metrics["timing"]["wall_s"] == 5.0  # the slowest shard: they ran side by side
    assert [m["shard"] for m in metrics["merged_from"]] == ["1/3", "2/3", "3/3"]
    # Merging again into the same directory replaces the previous merge.
    assert merge(*shards, "-o", out) == 0


def test_merge_of_free_running_shards(tmp_path: Path) -> None:
    """Shards of a free-running run merge into a free-running run: its metrics say so, with
    the shards' left_truth added up, and the recount agrees."""
    free = [write_shard(tmp_path / f"f{k}", IDS, k, 3, history="model") for k in (1, 2, 3)]
    out = tmp_path / "merged"
    assert merge(*free, "-o", out) == 0
    recount_run(out)
    metrics = json.loads((out / "metrics.json").read_text("utf-8"))
    assert metrics["history"] == "model"
    records = read_jsonl(out / "predictions.jsonl")
    assert {r["history"] for r in records} == {"model"}
    left = [r["left_truth_at"] for r in records]
    assert metrics["left_truth"]["never"] == left.count(None)
    assert sum(metrics["left_truth"]["at"].values()) == 7 - left.count(None)


def _drop_shard(shards: list[Path]) -> list[Path]:
    return [shards[0], shards[2]]


def _twice(shards: list[Path]) -> list[Path]:
    return [*shards, shards[1]]


def _other_model(shards: list[Path]) -> list[Path]:
    edit_metrics(shards[1], lambda m: m["fingerprints"].update(model="sha256:other"))
    return shards


def _other_n(shards: list[Path]) -> list[Path]:
    edit_metrics(shards[2], lambda m: m["scope"]["shard"].update(count=4))
    return shards


def _incomplete(shards: list[Path]) -> list[Path]:
    def change(m: dict[str, Any]) -> None:
        m["missing"] = ["s05"]

    edit_metrics(shards[2], change)
    return shards


def _unfinished(shards: list[Path]) -> list[Path]:
    (shards[1] / "metrics.json").unlink()
    (shards[1] / "journal.jsonl").write_text("", "utf-8")
    return shards


def _not_a_shard(shards: list[Path]) -> list[Path]:
    edit_metrics(shards[0], lambda m: m["scope"].update(shard=None))
    return shards


def _edited_predictions(shards: list[Path]) -> list[Path]:
    path = shards[0] / "predictions.jsonl"
    path.write_text(path.read_text("utf-8").replace('"counter"', '"table"', 1), "utf-8")
    return shards


def _recount_fails(shards: list[Path]) -> list[Path]:
    edit_metrics(shards[1], lambda m: m["m1"].update(correct=m["m1"]["correct"] + 1))
    return shards


def _being_rerun(shards: list[Path]) -> list[Path]:
    # Shard 2 is being run again: its newer, unfinished run journals in its subsets/.
    journal = new_subset_dir(shards[1], time.time()) / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("", "utf-8")
    return shards


def _other_overrides(shards: list[Path]) -> list[Path]:
    override = {"adapter": {"value": "/ckpt/other", "profile": "/ckpt/adapter"}}
    edit_metrics(shards[2], lambda m: m.update(overrides=override))
    return shards


def _other_history(shards: list[Path]) -> list[Path]:
    # Shard 3 evaluated free-running (--memeval-history model), the others teacher-forced.
    free = write_shard(shards[2].parent / "free-3", IDS, 3, 3, history="model")
    return [shards[0], shards[1], free]


def _overlap(shards: list[Path]) -> list[Path]:
    # Shard 2 re-labelled as shard 1 of the same N: shard 2 is then missing, and shard 1's
    # scenarios... are covered by two runs.
    extra = write_shard(shards[0].parent / "again", IDS, 1, 3)
    return [*shards, extra]


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (_drop_shard, "missing shard(s): 2/3"),
        (_twice, "shard 2/3 given 2 times"),
        (_overlap, "3 scenario(s) appear in more than one shard: 's00"),
        (_other_model, "model fingerprint differs between shards"),
        (_other_n, "number of shards N differs between shards"),
        (_incomplete, "incomplete, 1 scenario(s) have no result: 's05'"),
        (_unfinished, "not a finished run (its journal exists"),
        (_not_a_shard, "not a shard run"),
        (_edited_predictions, "edited after the run?"),
        (_recount_fails, "fails the recount"),
        (_being_rerun, "a newer unfinished run of this shard is in "),
        (_other_overrides, "overrides differs between shards"),
        (_other_history, "history differs between shards: shard 1/3"),
    ],
)
def test_merge_refuses_and_writes_nothing(
    shards: list[Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    breaks: Callable[[list[Path]], list[Path]],
    message: str,
) -> None:
    out = tmp_path / "merged"
    assert merge(*breaks(shards), "-o", out) == 1
    err = capsys.readouterr().err
    assert "refusing to merge, nothing written" in err
    assert message in err
    assert not out.exists()


def test_merge_does_not_overwrite_a_run_that_is_not_a_merge(
    shards: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "unsharded"
    out.mkdir()
    (out / "metrics.json").write_text('{"complete": true}', "utf-8")
    assert merge(*shards, "-o", out) == 1
    assert "already holds a run that is not a merge" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["metrics.json"]
    assert merge(*shards, "-o", shards[0]) == 1
    assert "is one of the shard runs" in capsys.readouterr().err
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "journal.jsonl").write_text("", "utf-8")
    assert merge(*shards, "-o", crashed) == 1
    assert "holds the journal of an unfinished run" in capsys.readouterr().err
    assert sorted(os.listdir(crashed)) == ["journal.jsonl"]
    # Unfinished runs are kept in subsets/<time>/ (runlayout.py).
    busy = tmp_path / "busy"
    journal = new_subset_dir(busy, time.time()) / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("", "utf-8")
    assert merge(*shards, "-o", busy) == 1
    err = capsys.readouterr().err
    assert f"holds the journal of an unfinished run ({journal})" in err
    assert sorted(os.listdir(busy)) == ["subsets"]


def test_merge_checks_out_only_once_it_holds_the_lock(
    shards: list[Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pytest run that writes OUT and finishes while the merge checks its shards: the merge
    sees it (it looks at OUT under the lock) and refuses, instead of replacing it."""
    out = tmp_path / "merged"
    acquire = RunLock.acquire.__func__  # type: ignore[attr-defined]

    def run_finishes_first(cls: type[RunLock], run_dir: Path, **kw: Any) -> RunLock:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.json").write_text('{"complete": true}', "utf-8")
        lock: RunLock = acquire(cls, run_dir, **kw)
        return lock

    monkeypatch.setattr(RunLock, "acquire", classmethod(run_finishes_first))
    assert merge(*shards, "-o", out) == 1
    assert "already holds a run that is not a merge" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["metrics.json"]


def test_merge_that_fails_while_writing_leaves_nothing(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "merged"

    def disk_full(path: Path, data: Any) -> None:
        raise OSError(28, "No space left on device")

    # finalize_run (core/results.py) writes the merged run, as it writes a pytest run.
    monkeypatch.setattr(results_module, "write_json", disk_full)
    with pytest.raises(OSError, match="No space left"):
        merge_module.merge_shards(shards, out)
    assert not out.exists()  # no half-written subsets/<time>/, no lock


def test_merge_carries_overrides_and_counts_overlong_scenarios(tmp_path: Path) -> None:
    override = {"adapter": {"value": "/ckpt/other", "profile": "/ckpt/adapter"}}
    shards = [
        write_shard(tmp_path / f"shard-{k}", IDS, k, 3, overlong=("s01", "s05"), overrides=override)
        for k in (1, 2, 3)
    ]
    recount_run(shards[0])
    # The count is recounted from the records' flags: a wrong claim fails.
    edit_metrics(shards[0], lambda m: m.update(overlong=0))
    with pytest.raises(RecountError, match="overlong: metrics say 0, recount gives 1"):
        recount_run(shards[0])
    edit_metrics(shards[0], lambda m: m.update(overlong=1))

    out = tmp_path / "merged"
    assert merge(*shards, "-o", out) == 0
    metrics = json.loads((out / "metrics.json").read_text("utf-8"))
    assert metrics["overrides"] == override
    assert metrics["overlong"] == 2
    recount_run(out)
    assert "overlong: 2/7 scenarios were evaluated past the model's context" in (
        format_summary(metrics)
    )
    assert "overlong" not in format_summary({**metrics, "overlong": 0})


# -- end to end: the demo checkpoint, unsharded and as 2 shards --------------------------------


FROZEN_PROFILE = """
[tool.memeval.ckpt.frozen]
model = "ckpt/base"
adapter = "ckpt/adapter"
benchmark = "bench.jsonl"
generation = { max_new_tokens = 16 }
"""


@pytest.mark.slow
def test_merged_shards_equal_the_unsharded_run(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # let the plugin divide the cores
    # The five shortest of the first 40 demo scenarios, in benchmark order: cheap to decode.
    pool = demo_records("oracle", 40)
    short = sorted(sorted(pool, key=lambda r: len(r["messages"]))[:5], key=pool.index)
    # A private copy of the checkpoint: all three runs must see the same weights, even while
    # the demo is being retrained (merge would rightly refuse shards of different adapters).
    ckpt = memeval_project.path / "ckpt"
    shutil.copytree(BASE_MODEL, ckpt / "base")
    shutil.copytree(ADAPTERS / "oracle", ckpt / "adapter")
    memeval_project.write(short, profiles=FROZEN_PROFILE)
    ok = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)  # failures are the model's answers
    full = memeval_project.run("--ckpt", "frozen")
    assert full.ret in ok, full.stdout.str()
    # Shard 1 (3 scenarios) on two CPU workers, shard 2 (2 scenarios) in one process.
    one = memeval_project.run(
        "--ckpt", "frozen", "--memeval-shard", "1/2", "-n", "2", "--memeval-gpus", "cpu"
    )
    assert one.ret in ok, one.stdout.str()
    two = memeval_project.run("--ckpt", "frozen", "--memeval-shard", "2/2")
    assert two.ret in ok, two.stdout.str()

    runs = memeval_project.run_dir("frozen")
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    cpu = f"cpu ({threads} thread{'s' if threads > 1 else ''})"
    one.stdout.fnmatch_lines(
        [
            "memeval: shard 1/2: scenarios 1-3 of 5 *",
            f"memeval: workers on the CPU (--memeval-gpus cpu), {threads} torch thread(s) each *",
            f"memeval: workers: gw0 -> {cpu}, gw1 -> {cpu}",
            "ckpt frozen: 3 scenarios (shard 1/2 complete; merge all shards with memeval merge)",
        ]
    )
    shard_records = read_jsonl(runs / "shard-1-of-2" / "predictions.jsonl")
    # Each record notes where it ran; torch in each worker really uses its share of the cores.
    assert {r["device"] for r in shard_records} == {cpu}
    assert {r["worker"] for r in shard_records} <= {"gw0", "gw1"}
    shard_metrics = json.loads((runs / "shard-1-of-2" / "metrics.json").read_text("utf-8"))
    assert shard_metrics["complete"] is False  # a shard is not the benchmark's result
    assert shard_metrics["scope"]["shard"]["spec"] == "1/2"
    assert shard_metrics["scope"]["shard"]["size"] == 3 and shard_metrics["missing"] == []

    # Only one shard: refused, nothing written.
    out = tmp_path / "merged"
    assert merge(runs / "shard-1-of-2", "-o", out) == 1
    assert not out.exists()

    assert merge(runs / "shard-1-of-2", runs / "shard-2-of-2", "-o", out) == 0
    recount_run(out)
    merged = json.loads((out / "metrics.json").read_text("utf-8"))
    unsharded = json.loads((runs / "metrics.json").read_text("utf-8"))
    assert merged["complete"] is unsharded["complete"] is True
    assert {k: merged[k] for k in COUNT_FIELDS} == {k: unsharded[k] for k in COUNT_FIELDS}
    assert merged["fingerprints"] == unsharded["fingerprints"]
    assert merged["scope"] == unsharded["scope"]
    assert content(read_jsonl(out / "predictions.jsonl")) == content(
        read_jsonl(runs / "predictions.jsonl")
    )
    shutil.rmtree(out)
