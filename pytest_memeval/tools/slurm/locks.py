"""Locks left by killed Slurm jobs: judged stale by asking Slurm, cleared before a submission.

A shard task or merge job killed by a node failure, its time limit or ``scancel`` leaves its
``memeval.lock`` naming a compute node where nothing can check its pid; the lock also names
its Slurm job (core/runlock.py), so :func:`stale_lock` asks Slurm whether that job has ended,
and :func:`clear_stale_locks` removes such locks before ``submit`` or ``resubmit`` writes there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pytest_memeval.core.runlock import (
    LOCK_NAME,
    describe_holder,
    holder_alive,
    read_holder,
    slurm_job_name,
)
from pytest_memeval.tools.slurm.jobs import JobInfo, SlurmError, SlurmRunner

__all__ = ["LockVerdict", "clear_stale_locks", "stale_lock"]


class LockVerdict(NamedTuple):
    """Whether a lock's run is over: ``True`` stale, ``False`` still running, ``None`` cannot
    tell; and why."""

    stale: bool | None
    why: str


def stale_lock(
    holder: Mapping[str, Any],
    show_job: Callable[[str], list[dict[str, str]]],
    ours: Iterable[str] = (),
) -> LockVerdict:
    """Whether the run that holds a ``memeval.lock`` is over, and why: ``(True, why)`` stale,
    ``(False, why)`` still running, ``(None, why)`` cannot tell.

    A task killed by a node failure, its time limit or ``scancel`` leaves its lock behind,
    naming a compute node where nothing can check its pid. The lock also names its Slurm job
    (runlock.py), so Slurm can say: a job in a final state will not write again. A job that
    Slurm no longer knows has ended too (Slurm forgets only ended jobs), which is trusted only
    for one of this submission's own jobs (``ours``: array and merge job ids), so that a job
    id of another cluster is never mistaken for ours.
    """
    alive = holder_alive(dict(holder))
    if alive is not None:
        return LockVerdict(
            (not alive), ("its process is still running" if alive else "its process is gone")
        )
    job = holder.get("slurm")
    if not isinstance(job, dict) or not job.get("job_id"):
        return LockVerdict(
            None,
            f"it was not taken in a Slurm job and host {holder.get('host')} is not this one",
        )
    name = slurm_job_name(job)
    records = [r for r in show_job(str(job["job_id"])) if r.get("JobId") == str(job["job_id"])]
    if not records:
        if str(job.get("array_job_id") or job["job_id"]) in set(ours):
            return LockVerdict(True, f"Slurm job {name} has ended (Slurm no longer knows it)")
        return LockVerdict(None, f"Slurm does not know job {name}")
    info = JobInfo.from_record(name, records[0])
    if info.final:
        return LockVerdict(True, f"Slurm job {name} is {info.state}")
    return LockVerdict(False, f"Slurm job {name} is {info.state}")


def clear_stale_locks(
    dirs: Iterable[Path], runner: SlurmRunner, ours: Iterable[str] = ()
) -> list[str]:
    """Remove the locks of ended runs from ``dirs`` before new jobs write there; returns a
    line per removed lock (the decision, printed). A lock whose run still runs, or that
    cannot be checked, refuses the submission (its tasks would be refused on the node)."""
    removed = []
    ours = list(ours)
    for run_dir in dirs:
        path = run_dir / LOCK_NAME
        holder = read_holder(path)
        if holder is None:
            continue
        verdict = stale_lock(holder, runner.show_job, ours) if holder else LockVerdict(None, "")
        why, who = verdict.why, describe_holder(holder)
        if verdict.stale is False:
            raise SlurmError(
                f"{run_dir} is in use by {who}: {why}; wait for it or scancel it, then run this "
                "again"
            )
        if verdict.stale is None:
            raise SlurmError(
                f"{run_dir} is locked by {who}, which cannot be checked from here"
                f"{': ' + why if why else ''}; if that run is gone, delete {path} and run "
                "this again"
            )
        if read_holder(path) == holder:  # only the very lock judged stale
            path.unlink(missing_ok=True)
        removed.append(f"memeval slurm: removed the stale lock {path} of {who}: {why}")
    return removed
