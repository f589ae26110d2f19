"""``memeval slurm submit`` and ``resubmit``: sending a submission's jobs to Slurm.

``submit`` makes the plan, refuses an ``--out`` the merge would refuse later, clears the locks
of ended jobs, writes the scripts and submits the array job and the merge job; ``resubmit``
sends the failed or missing shards again (resumed from their journals) with a new merge job.
Both can wait for the merge (status.py).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from pytest_memeval.core.rundir import METRICS, read_json
from pytest_memeval.tools.slurm.jobs import FINAL_STATES, SlurmError, SlurmRunner
from pytest_memeval.tools.slurm.locks import clear_stale_locks
from pytest_memeval.tools.slurm.plan import (
    MERGE_SCRIPT,
    SHARDS_SCRIPT,
    SLURM_DIR,
    SUBMISSION,
    Plan,
    make_plan,
)
from pytest_memeval.tools.slurm.record import job_ids, read_submission, submit_jobs, write_scripts
from pytest_memeval.tools.slurm.scripts import merge_script, shard_script
from pytest_memeval.tools.slurm.shards import shard_states, unfinished_run
from pytest_memeval.tools.slurm.status import merge_state, merged_metrics, wait

__all__ = ["resubmit", "submit"]


def _refuse_busy_out(out: Path, runner: SlurmRunner | None) -> None:
    """The merge would refuse DIR later (after the cluster hours): refuse now."""
    metrics = out / METRICS
    if metrics.is_file():
        try:
            previous = read_json(metrics)
        except (OSError, ValueError):
            previous = None
        if not (isinstance(previous, dict) and previous.get("merged_from")):
            raise SlurmError(
                f"{out}: holds a run that is not a merge (metrics.json); the merge job would "
                "refuse to overwrite it: choose another --out"
            )
    unfinished = unfinished_run(out) if out.is_dir() else None
    if unfinished is not None:
        raise SlurmError(
            f"{out}: holds an unfinished run ({unfinished}); the merge job would refuse to mix "
            "into it: choose another --out"
        )
    if runner is None or not (out / SLURM_DIR / SUBMISSION).is_file():
        return
    data = read_submission(out)
    for job in data.get("jobs", []):
        for record in runner.show_job(str(job["job_id"])):
            if record.get("JobState") not in FINAL_STATES:
                task = record.get("ArrayTaskId")
                name = f"{job['job_id']}_{task}" if task else str(job["job_id"])
                raise SlurmError(
                    f"{out}: job {name} of an earlier submission is still "
                    f"{record.get('JobState')}; wait for it (memeval slurm status {out}), "
                    f"scancel it, or use memeval slurm resubmit {out}"
                )


def submit(args: argparse.Namespace, runner: SlurmRunner) -> int:
    """``memeval slurm submit``: write the scripts, submit the array and the merge job."""
    plan = make_plan(args)
    if args.dry_run:
        print(f"# {plan.slurm_dir / SHARDS_SCRIPT}")
        print(shard_script(plan))
        print(f"# {plan.slurm_dir / MERGE_SCRIPT}")
        print(merge_script(plan))
        print(
            f"# dry run: nothing written or submitted. Would run: sbatch {SHARDS_SCRIPT}; "
            f"sbatch --dependency=afterok:<array job> --kill-on-invalid-dep=yes {MERGE_SCRIPT}"
        )
        return 0
    _refuse_busy_out(plan.out, runner)
    earlier = read_submission(plan.out) if (plan.slurm_dir / SUBMISSION).is_file() else {}
    dirs = [plan.out, *(plan.shard_dir(k) for k in range(1, plan.shards + 1))]
    for line in clear_stale_locks(dirs, runner, job_ids(earlier)):
        print(line)
    write_scripts(plan)
    jobs: list[dict[str, Any]] = []
    submit_jobs(plan, runner, jobs, range(1, plan.shards + 1), resume=False)
    shards_job, merge_job = jobs[0]["job_id"], jobs[1]["job_id"]
    print(
        f"memeval slurm: submitted {plan.shards} shard(s) of {plan.ckpt} as array job "
        f"{shards_job} and the merge into {plan.out} as job {merge_job}"
    )
    print(f"memeval slurm: follow with: memeval slurm status {shlex.quote(str(plan.out))}")
    if args.wait:
        return wait(plan.out, runner, poll=args.poll)
    return 0


def resubmit(out: Path, runner: SlurmRunner, *, wait_after: bool, poll: float) -> int:
    """``memeval slurm resubmit DIR``: failed and missing shards (resumed), a new merge job."""
    data = read_submission(out)
    plan = Plan.from_dict(data["plan"])
    jobs: list[dict[str, Any]] = list(data.get("jobs", []))
    states = shard_states(plan, jobs, runner.show_job)
    again = [s.k for s in states if s.needs_resubmit]
    latest_merge = merge_state(data, runner)
    info, merge_job = latest_merge.info, latest_merge.job_id
    if not again and merged_metrics(plan.out) and (info is None or info.state == "COMPLETED"):
        print(f"memeval slurm: nothing to resubmit: {plan.out} is merged and complete")
        return 0
    if not again and info is not None and not info.final:
        print(
            f"memeval slurm: nothing to resubmit: no shard failed and merge job {merge_job} "
            f"is {info.state}"
        )
        return wait(plan.out, runner, poll=poll) if wait_after else 0
    if info is not None and not info.final:
        runner.cancel(merge_job)  # it waits on a failed shard: Slurm would cancel it anyway
    # A killed task's (or merge job's) lock names a node where nothing can check it: clear
    # those of ended jobs, or the new tasks would be refused there.
    dirs = [plan.out, *(plan.shard_dir(k) for k in again)]
    for line in clear_stale_locks(dirs, runner, job_ids(data)):
        print(line)
    write_scripts(plan)  # the current scripts, as submit wrote them
    # Shards still pending or running keep their jobs; the new merge waits for them too (a
    # finished shard whose task is still checking its run included).
    after = [s.job.job_id for s in states if s.job and not s.job.final and s.k not in again]
    before = len(jobs)
    submit_jobs(plan, runner, jobs, again, resume=True, after_tasks=after)
    new = jobs[before:]
    if again:
        print(
            f"memeval slurm: resubmitted shard(s) {', '.join(f'{k}/{plan.shards}' for k in again)}"
            f" as array job {new[0]['job_id']} (resuming from their journals)"
        )
    print(f"memeval slurm: new merge job {new[-1]['job_id']} ({new[-1]['after'] or 'no wait'})")
    if wait_after:
        return wait(plan.out, runner, poll=poll)
    return 0
