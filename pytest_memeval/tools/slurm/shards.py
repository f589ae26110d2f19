"""The shards of a ``memeval slurm`` submission, one by one: a task's verdict and a shard's state.

:func:`check_shard` is what a shard task ends with (``memeval slurm check-shard``): its exit
status says whether the shard run is finished and covers its slice. :func:`unfinished_run` is
the run a resubmitted or requeued task resumes. :func:`shard_states` is what ``status`` and
``resubmit`` know of each shard, from its run directory and its latest array task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pytest_memeval.core.rundir import JOURNAL, JOURNAL_HEADER_KEY
from pytest_memeval.core.runlayout import SUBSETS, resume_target, top_level_run
from pytest_memeval.tools.compare import is_episode_run
from pytest_memeval.tools.episode_merge import EpisodeShard, load_episode_shard
from pytest_memeval.tools.merge import ShardRun, load_shard
from pytest_memeval.tools.slurm.jobs import JobInfo, task_info
from pytest_memeval.tools.slurm.plan import Plan

__all__ = [
    "INCOMPLETE_EXIT",
    "ShardState",
    "ShardVerdict",
    "check_shard",
    "shard_states",
    "tail",
    "unfinished_run",
]

#: Exit status of a shard task whose pytest ended normally (0 or 1) but whose shard run does
#: not cover its slice (no metrics, missing scenarios): not a result, so the task fails.
INCOMPLETE_EXIT = 65
_LOG_LINES = 8


# -- the task's verdict ---------------------------------------------------------------------


class ShardVerdict(NamedTuple):
    """A shard task's exit status and the one line that says why."""

    code: int
    line: str


def check_shard(shard_dir: Path, k: int, n: int, pytest_exit: int) -> ShardVerdict:
    """The exit status of shard task ``k``/``n`` and one line saying why.

    0 when the shard run is finished and covers its slice (whatever pytest said about wrong
    answers); pytest's own status when it crashed, was interrupted or killed (>= 2, 128+N for
    signal N); :data:`INCOMPLETE_EXIT` when pytest ended normally but the run is incomplete.
    """
    spec = f"{k}/{n}"
    problems: list[str] = []
    run: ShardRun | EpisodeShard | None = None
    if is_episode_run(shard_dir):
        # A closed-loop shard: the episode merge's own check (an environment error fails
        # the task, so that a resubmission resumes it).
        run = load_episode_shard(shard_dir, problems)
    elif shard_dir.is_dir():
        run = load_shard(shard_dir, problems)
    # load_shard refuses a finished run at the top with a newer unfinished run beside it (in
    # subsets/<time>/): that shard was run again since and did not finish.
    if run is not None and str(run.shard.get("spec")) != spec:
        problems.append(f"{shard_dir}: holds shard {run.shard.get('spec')}, not {spec}")
    if pytest_exit not in (0, 1):
        why = (
            f"killed by signal {pytest_exit - 128}"
            if pytest_exit > 128
            else f"pytest exited {pytest_exit}"
        )
        return ShardVerdict(
            pytest_exit, f"memeval: shard {spec} FAILED: {why}; the shard run did not finish"
        )
    if run is None or problems:
        detail = "; ".join(problems) or f"{shard_dir}: no run directory"
        return ShardVerdict(
            INCOMPLETE_EXIT, f"memeval: shard {spec} FAILED: incomplete shard run: {detail}"
        )
    failed = "" if pytest_exit == 0 else " (pytest exit 1: wrong answers are results)"
    what = "episode(s)" if isinstance(run, EpisodeShard) else "scenario(s)"
    return ShardVerdict(0, f"memeval: shard {spec} finished: {len(run.ids)} {what}{failed}")


def unfinished_run(run_dir: Path) -> Path | None:
    """The unfinished run of ``run_dir`` that ``--memeval-resume`` would continue, or ``None``.

    That is :func:`runlayout.resume_target` unless it is the finished top-level run itself
    (nothing to continue): the newest ``subsets/<time>/`` with a journal newer than the
    finished run, or an older version's unfinished journal at the top.
    """
    try:
        target = resume_target(run_dir)
    except (OSError, ValueError):
        # A damaged top-level metrics.json: not a finished run; any subsets journal counts.
        journals = sorted((run_dir / SUBSETS).glob(f"*/{JOURNAL}"), key=lambda p: p.parent.name)
        return journals[-1].parent if journals else None
    if target is None or (target == run_dir and top_level_run(run_dir) is not None):
        return None
    return target


# -- the run state of each shard -------------------------------------------------------------


@dataclass
class ShardState:
    """What ``status`` says about one shard."""

    k: int
    run: str  # done, running, pending, failed, missing
    job: JobInfo | None = None
    detail: str = ""
    log: Path | None = None
    log_tail: list[str] = field(default_factory=list)

    @property
    def needs_resubmit(self) -> bool:
        """Failed or never submitted: ``resubmit`` sends it again."""
        return self.run in ("failed", "missing")


def _journal_count(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip() and JOURNAL_HEADER_KEY.encode() not in line)


def tail(path: Path | None, lines: int = _LOG_LINES) -> list[str]:
    """The last ``lines`` non-blank lines of a log (read from its last 16 KiB); none if absent."""
    if path is None or not path.is_file():
        return []
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 16384))
        text = fh.read().decode("utf-8", "replace")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def shard_states(
    plan: Plan, jobs: Sequence[Mapping[str, Any]], show_job: Callable[[str], list[dict[str, str]]]
) -> list[ShardState]:
    """Each shard's state from its run directory and its latest job (``show_job`` asks Slurm)."""
    cache: dict[str, list[dict[str, str]]] = {}
    states = []
    for k in range(1, plan.shards + 1):
        latest = next(
            (j for j in reversed(jobs) if j.get("kind") == "shards" and k in j.get("tasks", [])),
            None,
        )
        info = None
        if latest is not None:
            array_job = str(latest["job_id"])
            if array_job not in cache:
                cache[array_job] = show_job(array_job)
            info = task_info(cache[array_job], array_job, k)
        states.append(_shard_state(plan, k, latest, info))
    return states


def _shard_state(
    plan: Plan, k: int, latest: Mapping[str, Any] | None, info: JobInfo | None
) -> ShardState:
    """Shard ``k``'s state from its run directory, its latest array job and that task's info."""
    verdict = check_shard(plan.shard_dir(k), k, plan.shards, 0)
    log = plan.shard_log(k, str(latest["job_id"])) if latest is not None else None
    state = ShardState(k=k, run="missing", job=info, log=log)
    # A job still queued or running decides first: the directory may hold an earlier
    # submission's finished shard run until this one starts writing.
    if info is not None and info.state in ("PENDING", "REQUEUED", "CONFIGURING"):
        state.run = "pending"
    elif info is not None and not info.final:
        # Its run journals into subsets/<time>/ until it is finished (runlayout.py).
        unfinished = unfinished_run(plan.shard_dir(k))
        done = _journal_count(unfinished / JOURNAL) if unfinished is not None else 0
        state.run, state.detail = "running", f"{done} scenario(s) in its journal"
    elif info is not None and info.state != "COMPLETED":
        # The task failed: whatever finished run the directory holds is an earlier one
        # (a task succeeds exactly when check-shard found its run finished).
        state.run = "failed"
        state.detail = (
            verdict.line.split(" FAILED: ", 1)[-1]
            if verdict.code
            else ("the task failed; the finished shard run in the directory is an earlier one")
        )
        state.log_tail = tail(log)
    elif verdict.code == 0:
        state.run, state.detail = "done", verdict.line.split(": ", 1)[1]
    elif latest is None:
        state.detail = "never submitted"
    else:
        state.run = "failed"
        if info is None:
            state.detail = (
                f"job {latest['job_id']}_{k} is no longer known to Slurm and the shard run "
                "is incomplete"
            )
        else:
            state.detail = verdict.line.split(" FAILED: ", 1)[-1]
        state.log_tail = tail(log)
    return state
