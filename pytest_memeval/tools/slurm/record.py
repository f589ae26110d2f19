"""What a ``memeval slurm`` submission writes into ``DIR/slurm/``: its scripts and its record.

``submission.json`` holds the plan and every job submitted for it (array jobs with their
tasks, merge jobs with their dependency), saved after each ``sbatch``, so that ``status`` and
``resubmit`` know every job even when a later ``sbatch`` failed. The record is JSON as written
here; :func:`read_submission` refuses a directory that holds none.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_memeval.core.rundir import atomic_write, read_json, write_json
from pytest_memeval.tools.slurm.jobs import SlurmError, SlurmRunner
from pytest_memeval.tools.slurm.plan import (
    MERGE_SCRIPT,
    SHARDS_SCRIPT,
    SLURM_DIR,
    SUBMISSION,
    Plan,
)
from pytest_memeval.tools.slurm.scripts import dependency, merge_script, shard_script

__all__ = ["job_ids", "read_submission", "submit_jobs", "write_scripts"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_submission(out: Path) -> dict[str, Any]:
    """``DIR/slurm/submission.json``: the plan (as :meth:`Plan.as_dict`) and the jobs."""
    path = out / SLURM_DIR / SUBMISSION
    if not path.is_file():
        raise SlurmError(
            f"{out}: no {SLURM_DIR}/{SUBMISSION}: not a directory `memeval slurm submit` wrote "
            "(pass the --out DIR of the submission, by default runs/<ckpt>)"
        )
    data = read_json(path)
    if not isinstance(data, dict) or "plan" not in data:
        raise SlurmError(f"{path}: not a memeval slurm submission record")
    return data


def submit_jobs(
    plan: Plan,
    runner: SlurmRunner,
    jobs: list[dict[str, Any]],
    tasks: Sequence[int],
    *,
    resume: bool,
    after_tasks: Sequence[str] = (),
) -> None:
    """Submit the array (for ``tasks``; none: merge only) and the merge job, appending each
    to ``jobs`` and saving the record at once: if the second sbatch fails, ``status`` and
    ``resubmit`` still know the first job."""
    array_job = None
    if tasks:
        spec = ",".join(map(str, tasks))
        args = [f"--array={spec}", str(plan.slurm_dir / SHARDS_SCRIPT)]
        array_job = runner.sbatch(args + (["resume"] if resume else []))
        jobs.append({"kind": "shards", "job_id": array_job, "tasks": list(tasks), "at": _now()})
        _save(plan, jobs)
    dep = dependency(array_job, after_tasks)
    merge_args = [f"--dependency={dep}", "--kill-on-invalid-dep=yes"] if dep else []
    merge_job = runner.sbatch([*merge_args, str(plan.slurm_dir / MERGE_SCRIPT)])
    jobs.append({"kind": "merge", "job_id": merge_job, "after": dep, "at": _now()})
    _save(plan, jobs)


def job_ids(data: Mapping[str, Any]) -> list[str]:
    """Every job id a submission record holds (array and merge jobs)."""
    return [str(job["job_id"]) for job in data.get("jobs", []) if job.get("job_id")]


def write_scripts(plan: Plan) -> None:
    """Write both batch scripts into ``DIR/slurm/`` (executable), and make its ``logs/``."""
    (plan.slurm_dir / "logs").mkdir(parents=True, exist_ok=True)
    for name, text in ((SHARDS_SCRIPT, shard_script(plan)), (MERGE_SCRIPT, merge_script(plan))):
        path = plan.slurm_dir / name
        atomic_write(path, [text])
        path.chmod(0o755)


def _save(plan: Plan, jobs: list[dict[str, Any]]) -> None:
    write_json(plan.slurm_dir / SUBMISSION, {"plan": plan.as_dict(), "jobs": jobs})
