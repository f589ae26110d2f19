"""``memeval slurm status`` and ``--wait``: where a submission stands, and waiting for its merge.

:func:`report_status` prints each shard's job and run state (with the log tail of a failed
one) and the latest merge job's; :func:`wait` polls Slurm until that merge job ends. Both read
the submission record and ask Slurm through :class:`SlurmRunner`; nothing here submits.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pytest_memeval.core.rundir import METRICS, read_json
from pytest_memeval.tools.slurm.jobs import JobInfo, SlurmRunner
from pytest_memeval.tools.slurm.plan import Plan
from pytest_memeval.tools.slurm.record import read_submission
from pytest_memeval.tools.slurm.shards import ShardState, shard_states, tail

__all__ = ["MergeState", "StatusReport", "merge_state", "merged_metrics", "report_status", "wait"]


class MergeState(NamedTuple):
    """The latest merge job of a submission: Slurm's view of it (``None``: not known to Slurm,
    or none submitted) and its id (``""``: none submitted)."""

    info: JobInfo | None
    job_id: str


class StatusReport(NamedTuple):
    """What ``status`` found: each shard's state, and whether the merged run is there."""

    states: list[ShardState]
    merged: bool


def merge_state(data: Mapping[str, Any], runner: SlurmRunner) -> MergeState:
    """The latest merge job of the submission record ``data``, as Slurm sees it now."""
    merges = [j for j in data.get("jobs", []) if j.get("kind") == "merge"]
    if not merges:
        return MergeState(None, "")
    job_id = str(merges[-1]["job_id"])
    records = runner.show_job(job_id)
    info = JobInfo.from_record(job_id, records[0]) if records else None
    return MergeState(info, job_id)


def merged_metrics(out: Path) -> dict[str, Any] | None:
    """``DIR/metrics.json`` when it is there, readable and complete, else ``None``."""
    try:
        metrics = read_json(out / METRICS)
    except (OSError, ValueError):
        return None
    if isinstance(metrics, dict) and metrics.get("complete") is True:
        return metrics
    return None


def merged_numbers(merged: dict[str, Any]) -> str:
    """The merged run's headline: m1 of a scenario run, success of a closed-loop run."""
    if merged.get("kind") == "episodes":
        numbers = merged["episodes"]
        success = numbers["success"]
        return f"episodes={numbers['episodes']} success={success['correct']}/{success['total']}"
    m1 = merged["m1"]
    return f"n={merged['n']} m1={m1['correct']}/{m1['total']}"


def report_status(out: Path, runner: SlurmRunner) -> StatusReport:
    """Print the status table; returns the shard states and whether the merged run is there."""
    data = read_submission(out)
    plan = Plan.from_dict(data["plan"])
    jobs = data.get("jobs", [])
    states = shard_states(plan, jobs, runner.show_job)
    print(f"memeval slurm: {plan.ckpt}, {plan.shards} shard(s) into {plan.out}")
    for s in states:
        job = s.job.describe() if s.job else "no job known to Slurm"
        line = f"  shard {s.k}/{plan.shards}: {s.run:<8} {job}"
        print(line + (f"; {s.detail}" if s.detail else ""))
        if s.run == "failed":
            if s.log is not None:
                print(f"    log {s.log}:")
            for text in s.log_tail or ["(no log)"]:
                print(f"      | {text}")
    latest_merge = merge_state(data, runner)
    info, job_id = latest_merge.info, latest_merge.job_id
    merged = merged_metrics(plan.out)
    failed = [f"{s.k}/{plan.shards}" for s in states if s.run == "failed"]
    if merged is not None and merged.get("merged_from") and (info is None or info.final):
        # (while the latest merge job waits, a metrics.json there is an earlier merge's)
        what = f"done: {plan.out} {merged_numbers(merged)}"
    elif info is None:
        what = "not known to Slurm" if job_id else "not submitted"
    elif info.state == "CANCELLED" and "Dependency" in info.reason:
        what = "never ran: a shard failed (resubmit with memeval slurm resubmit DIR)"
    elif not info.final and failed:
        # afterok on an array is decided once every task ended: Slurm cancels it then.
        what = f"will not run: shard(s) {', '.join(failed)} failed (memeval slurm resubmit DIR)"
    else:
        what = "waiting for the shards" if info.state == "PENDING" else info.state.lower()
    merge_job = info.describe() if info else (f"job {job_id}" if job_id else "")
    print(f"  merge:     {merge_job}; {what}")
    if info is not None and info.state in ("FAILED", "TIMEOUT", "OUT_OF_MEMORY"):
        log = plan.merge_log(job_id)
        print(f"    log {log}:")
        for text in tail(log) or ["(no log)"]:
            print(f"      | {text}")
    done = merged is not None and bool(merged.get("merged_from"))
    return StatusReport(states=states, merged=done and (info is None or info.state == "COMPLETED"))


def wait(out: Path, runner: SlurmRunner, *, poll: float = 5.0) -> int:
    """Block until the latest merge job ends; 0 only if DIR/metrics.json is complete."""
    data = read_submission(out)
    delay = min(1.0, poll)
    while True:
        info = merge_state(data, runner).info
        if info is None or info.final:
            break
        time.sleep(delay)
        delay = min(poll, delay * 1.5)  # quick at first (short jobs), then every `poll` s
    report = report_status(out, runner)
    if report.merged and info is not None and info.state == "COMPLETED":
        print(f"memeval slurm: merged run complete: {out}")
        return 0
    failed = [f"{s.k}/{len(report.states)}" for s in report.states if s.run != "done"]
    why = f"shard(s) not finished: {', '.join(failed)}" if failed else "the merge job failed"
    print(
        f"memeval slurm: no complete merged run in {out}: {why}; "
        f"see above, then: memeval slurm resubmit {shlex.quote(str(out))}",
        file=sys.stderr,
    )
    return 1
