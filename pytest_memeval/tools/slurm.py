"""``memeval slurm submit|status|resubmit``: shards as a Slurm array job, merged by a job.

``submit`` writes two batch scripts into ``DIR/slurm/`` and submits them:

* ``shards.sbatch``, an array job with one task per shard. Task K runs, in the project
  directory, ``pytest [-n G] --ckpt NAME --memeval-shard K/N --memeval-out=DIR/shard-K-of-N``
  and then ``memeval slurm check-shard``, whose exit status is the task's: pytest exits 1 when
  an answer is wrong, which is a *finished* shard, so a task succeeds exactly when its shard
  run is finished and covers its whole slice (the merge's own check), and fails on a crash, a
  kill, a timeout or an incomplete run;
* ``merge.sbatch``, one job that runs ``memeval merge`` into DIR. It depends on the array
  with ``afterok`` and ``--kill-on-invalid-dep=yes``: it runs only once every shard succeeded,
  and Slurm cancels it as soon as one fails (it never waits forever).

``DIR/slurm/submission.json`` records what was submitted (job ids per shard), so ``status``
can show each shard's job and run state and ``resubmit`` can send only the failed or missing
shards again (resumed from their journals) with a new merge job.

Everything that builds scripts or reads Slurm's answers is a pure function (unit-tested);
``sbatch``/``scontrol``/``scancel`` are called only through :class:`SlurmRunner`.
Slurm facts this relies on: the default ``--export=ALL`` hands the submitting shell's
environment to the job (``PATH``, a virtualenv), and an array task's ``CUDA_VISIBLE_DEVICES``
lists the GPUs it was allocated, which the plugin's worker binding splits one per worker.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_memeval.core.history import HISTORIES, HISTORY_MODEL, HISTORY_TRUTH, RUN_DIR_SUFFIX
from pytest_memeval.core.profiles import ProfileError, memeval_table, read_toml, resolve_profile
from pytest_memeval.core.rundir import (
    JOURNAL,
    JOURNAL_HEADER_KEY,
    METRICS,
    atomic_write,
    read_json,
    write_json,
)
from pytest_memeval.core.runlayout import SUBSETS, resume_target, top_level_run
from pytest_memeval.core.runlock import (
    LOCK_NAME,
    describe_holder,
    holder_alive,
    read_holder,
    slurm_job_name,
)
from pytest_memeval.core.sharding import ShardError, parse_shard, shard_dir_name
from pytest_memeval.tools.merge import load_shard

__all__ = [
    "INCOMPLETE_EXIT",
    "JobInfo",
    "Plan",
    "ShardState",
    "SlurmError",
    "SlurmRunner",
    "SlurmSettings",
    "array_tasks",
    "check_shard",
    "cli_arguments",
    "cli_main",
    "load_settings",
    "merge_script",
    "parse_scontrol",
    "shard_script",
    "shard_states",
    "stale_lock",
    "unfinished_run",
]

SLURM_DIR = "slurm"
SUBMISSION = "submission.json"
SHARDS_SCRIPT = "shards.sbatch"
MERGE_SCRIPT = "merge.sbatch"
#: Exit status of a shard task whose pytest ended normally (0 or 1) but whose shard run does
#: not cover its slice (no metrics, missing scenarios): not a result, so the task fails.
INCOMPLETE_EXIT = 65
#: Job states after which a job will not run again (``scontrol show job`` names).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
    }
)
_SETTINGS_KEYS = {"partition", "time", "account", "sbatch_args", "gpus_per_shard"}
_LOG_LINES = 8


class SlurmError(Exception):
    """A Slurm command failed, or the submission cannot go ahead; the message says why."""


# -- settings and plan --------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmSettings:
    """sbatch options for both jobs; defaults come from ``[tool.memeval.slurm]``."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()

    def header_lines(self) -> list[str]:
        """``#SBATCH`` lines for these options."""
        lines = []
        for key in ("partition", "time", "account"):
            value = getattr(self, key)
            if value:
                lines.append(f"#SBATCH --{key}={value}")
        lines += [f"#SBATCH {arg}" for arg in self.sbatch_args]
        return lines


def load_settings(pyproject: Path) -> tuple[SlurmSettings, int | None]:
    """``[tool.memeval.slurm]`` of ``pyproject``: sbatch defaults and ``gpus_per_shard``."""
    table = memeval_table(pyproject, "slurm")
    where = f"{pyproject}: [tool.memeval.slurm]"
    unknown = set(table) - _SETTINGS_KEYS
    if unknown:
        raise SlurmError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_SETTINGS_KEYS)})"
        )
    for key in ("partition", "time", "account"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise SlurmError(f"{where}: {key!r} must be a non-empty string")
    extra = table.get("sbatch_args", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) and a for a in extra):
        raise SlurmError(f"{where}: 'sbatch_args' must be a list of strings, e.g. ['--qos=high']")
    gpus = table.get("gpus_per_shard")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise SlurmError(f"{where}: 'gpus_per_shard' must be an integer >= 0")
    settings = SlurmSettings(
        partition=table.get("partition"),
        time=table.get("time"),
        account=table.get("account"),
        sbatch_args=tuple(extra),
    )
    return settings, gpus


@dataclass(frozen=True)
class Plan:
    """What ``submit`` submits: everything the scripts are generated from."""

    ckpt: str
    shards: int
    gpus_per_shard: int
    out: Path
    project: Path
    python: str
    settings: SlurmSettings = field(default_factory=SlurmSettings)
    #: the prompts' history: ``truth`` (teacher-forced) or ``model`` (free-running)
    history: str = HISTORY_TRUTH

    @property
    def slurm_dir(self) -> Path:
        """``DIR/slurm``: the scripts, the submission record and the logs."""
        return self.out / SLURM_DIR

    def shard_dir(self, k: int) -> Path:
        """Shard ``k``'s run directory, ``DIR/shard-K-of-N``."""
        return self.out / shard_dir_name(k, self.shards)

    def shard_log(self, k: int, job_id: str) -> Path:
        """The log of shard ``k``'s task in array job ``job_id``."""
        return self.slurm_dir / "logs" / f"shard-{k}-of-{self.shards}.job-{job_id}.log"

    def merge_log(self, job_id: str) -> Path:
        """The log of merge job ``job_id``."""
        return self.slurm_dir / "logs" / f"merge.job-{job_id}.log"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data for ``submission.json``."""
        return {
            "ckpt": self.ckpt,
            "shards": self.shards,
            "gpus_per_shard": self.gpus_per_shard,
            "out": str(self.out),
            "project": str(self.project),
            "python": self.python,
            "history": self.history,
            "sbatch": {
                "partition": self.settings.partition,
                "time": self.settings.time,
                "account": self.settings.account,
                "sbatch_args": list(self.settings.sbatch_args),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan :meth:`as_dict` wrote."""
        sb = data.get("sbatch") or {}
        return cls(
            ckpt=str(data["ckpt"]),
            shards=int(data["shards"]),
            gpus_per_shard=int(data["gpus_per_shard"]),
            out=Path(data["out"]),
            project=Path(data["project"]),
            python=str(data["python"]),
            # a submission recorded before free-running runs existed was teacher-forced
            history=str(data.get("history", HISTORY_TRUTH)),
            settings=SlurmSettings(
                partition=sb.get("partition"),
                time=sb.get("time"),
                account=sb.get("account"),
                sbatch_args=tuple(sb.get("sbatch_args") or ()),
            ),
        )


def _sbatch_path(path: Path) -> str:
    # Inside #SBATCH lines sbatch honours double quotes (a path with spaces); '%' starts a
    # filename pattern there (%A, %a, %j), so a literal one is refused upstream.
    text = str(path)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _check_path(path: Path) -> None:
    if "%" in str(path) or '"' in str(path) or "\n" in str(path):
        raise SlurmError(
            f"{path}: Slurm log paths cannot hold '%', '\"' or a newline; choose another --out"
        )


# -- the generated scripts (pure) ----------------------------------------------------------


def shard_script(plan: Plan) -> str:
    """The array job's batch script: task K evaluates shard K of N."""
    n, q = plan.shards, shlex.quote
    logs = plan.slurm_dir / "logs" / f"shard-%a-of-{n}.job-%A.log"
    header = [
        "#!/bin/bash",
        f"# Generated by `memeval slurm submit`: shard K of {n} of checkpoint {plan.ckpt} per",
        "# array task. Resubmit failed shards with `memeval slurm resubmit DIR`.",
        f"#SBATCH --job-name=memeval-{plan.ckpt}",
        f"#SBATCH --array=1-{n}",
        # One pytest per task: xdist starts the workers itself; an srun step with several
        # tasks would start several controllers writing one run directory.
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
    ]
    if plan.gpus_per_shard:
        header.append(f"#SBATCH --gpus-per-node={plan.gpus_per_shard}")
    header.append(f"#SBATCH --output={_sbatch_path(logs)}")
    header += plan.settings.header_lines()
    # GPUs: Slurm sets CUDA_VISIBLE_DEVICES to the allocated ones; the plugin binds one xdist
    # worker to each of exactly those. CPU: say so, so that a CUDA_VISIBLE_DEVICES exported
    # from the login shell is ignored.
    pytest_args = f"-n {plan.gpus_per_shard}" if plan.gpus_per_shard else "--memeval-gpus=cpu"
    if plan.history != HISTORY_TRUTH:
        pytest_args += f" --memeval-history={plan.history}"
    body = f"""
# Checkpoints, data and run directories must be on a filesystem every node sees.
cd {q(str(plan.project))} || exit 1
K="$SLURM_ARRAY_TASK_ID"
N={n}
OUT={q(str(plan.out))}
PYTHON={q(plan.python)}
SHARD_DIR="$OUT/shard-$K-of-$N"
RESUME=
# `memeval slurm resubmit` passes "resume", and a requeued task (Restarts > 0) resumes too,
# when the shard has an unfinished run (its journal, in $SHARD_DIR/{SUBSETS}/<time>/) newer
# than its finished one: pytest --memeval-resume continues that run.
if {{ [ "${{1:-}}" = resume ] || [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; }} \\
        && UNFINISHED=$("$PYTHON" -m pytest_memeval slurm unfinished "$SHARD_DIR"); then
    RESUME=--memeval-resume
    echo "memeval: resuming the unfinished shard run in $UNFINISHED"
fi
echo "memeval: shard $K/$N on $(hostname) (job ${{SLURM_ARRAY_JOB_ID}}_$K)" \\
    "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}} $RESUME"
"$PYTHON" -m pytest {pytest_args} --ckpt={q(plan.ckpt)} --memeval-shard="$K/$N" \\
    --memeval-out="$SHARD_DIR" $RESUME
rc=$?
# pytest exits 1 when an answer is wrong: that shard is finished. The task succeeds only if
# the shard run is finished and covers its slice, so that the merge job's afterok means it.
"$PYTHON" -m pytest_memeval slurm check-shard "$SHARD_DIR" --shard="$K/$N" --pytest-exit="$rc"
"""
    return "\n".join(header) + "\n" + body


def merge_script(plan: Plan) -> str:
    """The merge job's batch script (its dependency is given on the sbatch command line)."""
    q = plan.slurm_dir / "logs" / "merge.job-%j.log"
    shards = " \\\n    ".join(
        shlex.quote(str(plan.shard_dir(k))) for k in range(1, plan.shards + 1)
    )
    header = [
        "#!/bin/bash",
        f"# Generated by `memeval slurm submit`: merge the {plan.shards} shard runs of "
        f"{plan.ckpt} into one run.",
        f"#SBATCH --job-name=memeval-{plan.ckpt}-merge",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        # Cancelled by Slurm as soon as a shard fails, instead of pending forever.
        "#SBATCH --kill-on-invalid-dep=yes",
        f"#SBATCH --output={_sbatch_path(q)}",
        *plan.settings.header_lines(),
    ]
    body = f"""
cd {shlex.quote(str(plan.project))} || exit 1
{shlex.quote(plan.python)} -m pytest_memeval merge \\
    {shards} \\
    -o {shlex.quote(str(plan.out))}
"""
    return "\n".join(header) + "\n" + body


def dependency(array_job: str | None, pending_tasks: Iterable[str] = ()) -> str | None:
    """``afterok:JOB[:JOB_K...]``: the array (every task) and single still-active tasks."""
    jobs = ([array_job] if array_job else []) + list(pending_tasks)
    return "afterok:" + ":".join(jobs) if jobs else None


# -- the task's verdict ---------------------------------------------------------------------


def check_shard(shard_dir: Path, k: int, n: int, pytest_exit: int) -> tuple[int, str]:
    """The exit status of shard task ``k``/``n`` and one line saying why.

    0 when the shard run is finished and covers its slice (whatever pytest said about wrong
    answers); pytest's own status when it crashed, was interrupted or killed (>= 2, 128+N for
    signal N); :data:`INCOMPLETE_EXIT` when pytest ended normally but the run is incomplete.
    """
    spec = f"{k}/{n}"
    problems: list[str] = []
    run = load_shard(shard_dir, problems) if shard_dir.is_dir() else None
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
        return pytest_exit, f"memeval: shard {spec} FAILED: {why}; the shard run did not finish"
    if run is None or problems:
        detail = "; ".join(problems) or f"{shard_dir}: no run directory"
        return INCOMPLETE_EXIT, f"memeval: shard {spec} FAILED: incomplete shard run: {detail}"
    failed = "" if pytest_exit == 0 else " (pytest exit 1: wrong answers are results)"
    return 0, f"memeval: shard {spec} finished: {len(run.ids)} scenario(s){failed}"


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


# -- reading Slurm's answers (pure) ------------------------------------------------------------


def parse_scontrol(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol -o show job``: one line per job, ``Key=value`` words.

    A value with spaces (a path, a comment) continues until the next ``Key=`` word.
    """
    records = []
    for line in text.splitlines():
        record: dict[str, str] = {}
        last: str | None = None
        for word in line.split(" "):
            m = re.match(r"([A-Za-z][A-Za-z0-9_:/]*)=(.*)", word)
            if m:
                last = m.group(1)
                record[last] = m.group(2)
            elif last is not None and word:
                record[last] += " " + word
        if "JobId" in record:
            records.append(record)
    return records


def array_tasks(text: str) -> set[int]:
    """``ArrayTaskId`` as a set: ``"3"``, ``"1-3"``, ``"1,4-6%2"`` (``%`` = throttle)."""
    tasks: set[int] = set()
    for part in text.split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", part.strip())
        if m:
            start, stop = int(m.group(1)), int(m.group(2) or m.group(1))
            tasks.update(range(start, stop + 1, int(m.group(3) or 1)))
    return tasks


@dataclass(frozen=True)
class JobInfo:
    """One job (or array task) as Slurm sees it."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: str = ""
    node: str = ""

    @classmethod
    def from_record(cls, job_id: str, record: Mapping[str, str]) -> JobInfo:
        """From one :func:`parse_scontrol` record."""
        return cls(
            job_id=job_id,
            state=record.get("JobState", "UNKNOWN"),
            reason=record.get("Reason", ""),
            exit_code=record.get("ExitCode", ""),
            node=record.get("NodeList", ""),
        )

    @property
    def final(self) -> bool:
        """The job has ended and will not run again."""
        return self.state in FINAL_STATES

    def describe(self) -> str:
        """``job 7_2 FAILED (NonZeroExitCode), exit 137``."""
        text = f"job {self.job_id} {self.state}"
        if self.state not in ("COMPLETED", "RUNNING") and self.reason not in ("", "None"):
            text += f" ({self.reason})"
        if self.final and self.exit_code and self.exit_code != "0:0":
            text += f", exit {_exit_text(self.exit_code)}"
        return text


def _exit_text(code: str) -> str:
    """Slurm's ``rc:signal`` in words."""
    rc, _, sig = code.partition(":")
    return f"{rc} (signal {sig})" if sig not in ("", "0") else rc


def task_info(records: Sequence[Mapping[str, str]], array_job: str, k: int) -> JobInfo | None:
    """Task ``k`` of array ``array_job`` among ``scontrol`` records (pending ones are grouped)."""
    for record in records:
        if record.get("ArrayJobId") != array_job:
            continue
        if k in array_tasks(record.get("ArrayTaskId", "")):
            return JobInfo.from_record(f"{array_job}_{k}", record)
    return None


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


def _tail(path: Path | None, lines: int = _LOG_LINES) -> list[str]:
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
        code, verdict = check_shard(plan.shard_dir(k), k, plan.shards, 0)
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
                verdict.split(" FAILED: ", 1)[-1]
                if code
                else ("the task failed; the finished shard run in the directory is an earlier one")
            )
            state.log_tail = _tail(log)
        elif code == 0:
            state.run, state.detail = "done", verdict.split(": ", 1)[1]
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
                state.detail = verdict.split(" FAILED: ", 1)[-1]
            state.log_tail = _tail(log)
        states.append(state)
    return states


# -- locks left by killed jobs ----------------------------------------------------------------


def stale_lock(
    holder: Mapping[str, Any],
    show_job: Callable[[str], list[dict[str, str]]],
    ours: Iterable[str] = (),
) -> tuple[bool | None, str]:
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
        return (not alive), ("its process is still running" if alive else "its process is gone")
    job = holder.get("slurm")
    if not isinstance(job, dict) or not job.get("job_id"):
        return (
            None,
            f"it was not taken in a Slurm job and host {holder.get('host')} is not this one",
        )
    name = slurm_job_name(job)
    records = [r for r in show_job(str(job["job_id"])) if r.get("JobId") == str(job["job_id"])]
    if not records:
        if str(job.get("array_job_id") or job["job_id"]) in set(ours):
            return True, f"Slurm job {name} has ended (Slurm no longer knows it)"
        return None, f"Slurm does not know job {name}"
    info = JobInfo.from_record(name, records[0])
    if info.final:
        return True, f"Slurm job {name} is {info.state}"
    return False, f"Slurm job {name} is {info.state}"


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
        stale, why = stale_lock(holder, runner.show_job, ours) if holder else (None, "")
        who = describe_holder(holder)
        if stale is False:
            raise SlurmError(
                f"{run_dir} is in use by {who}: {why}; wait for it or scancel it, then run this "
                "again"
            )
        if stale is None:
            raise SlurmError(
                f"{run_dir} is locked by {who}, which cannot be checked from here"
                f"{': ' + why if why else ''}; if that run is gone, delete {path} and run "
                "this again"
            )
        if read_holder(path) == holder:  # only the very lock judged stale
            path.unlink(missing_ok=True)
        removed.append(f"memeval slurm: removed the stale lock {path} of {who}: {why}")
    return removed


# -- talking to Slurm ---------------------------------------------------------------------


class SlurmRunner:
    """The one place that runs ``sbatch``, ``scontrol`` and ``scancel``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env) if env is not None else None

    def run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run one Slurm client command, output captured."""
        try:
            return subprocess.run(
                list(args), capture_output=True, text=True, env=self.env, check=False
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{args[0]}: command not found; run this on a host with the Slurm client "
                "commands (a login node)"
            ) from None

    def sbatch(self, args: Sequence[str]) -> str:
        """Submit; returns the job id."""
        done = self.run(["sbatch", "--parsable", *args])
        if done.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def show_job(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol -o show job ID`` records; empty once Slurm has forgotten the job."""
        done = self.run(["scontrol", "-o", "show", "job", job_id])
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return []
            raise SlurmError(f"scontrol show job {job_id} failed: {done.stderr.strip()}")
        return parse_scontrol(done.stdout)

    def cancel(self, job_id: str) -> None:
        """``scancel JOB``; a job that already ended is no error."""
        self.run(["scancel", job_id])


# -- the submission record ------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_submission(out: Path) -> dict[str, Any]:
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


def _submit_jobs(
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


def _job_ids(data: Mapping[str, Any]) -> list[str]:
    """Every job id a submission record holds (array and merge jobs)."""
    return [str(job["job_id"]) for job in data.get("jobs", []) if job.get("job_id")]


def _write_scripts(plan: Plan) -> None:
    (plan.slurm_dir / "logs").mkdir(parents=True, exist_ok=True)
    for name, text in ((SHARDS_SCRIPT, shard_script(plan)), (MERGE_SCRIPT, merge_script(plan))):
        path = plan.slurm_dir / name
        atomic_write(path, [text])
        path.chmod(0o755)


def _save(plan: Plan, jobs: list[dict[str, Any]]) -> None:
    write_json(plan.slurm_dir / SUBMISSION, {"plan": plan.as_dict(), "jobs": jobs})


# -- commands ---------------------------------------------------------------------------------


def _project_defaults(project: Path) -> tuple[Path, str]:
    """``(profiles file, runs parent)`` as pytest would take them from the project's pyproject."""
    pyproject = project / "pyproject.toml"
    try:
        data = read_toml(pyproject)
    except ProfileError as exc:
        raise SlurmError(str(exc)) from None
    ini: dict[str, Any] = data.get("tool", {}).get("pytest", {}).get("ini_options", {}) or {}
    profiles = ini.get("memeval_profiles")
    return (project / profiles if profiles else pyproject), str(ini.get("memeval_out", "runs"))


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``submit``: the command line over ``[tool.memeval.slurm]``, checked."""
    project = Path(args.project).resolve()
    if not project.is_dir():
        raise SlurmError(f"--project {project}: not a directory")
    profiles, runs = _project_defaults(project)
    try:
        resolve_profile(args.ckpt, profiles)
    except ProfileError as exc:
        raise SlurmError(str(exc)) from None
    settings, gpus_default = load_settings(project / "pyproject.toml")
    settings = SlurmSettings(
        partition=args.partition or settings.partition,
        time=args.time or settings.time,
        account=args.account or settings.account,
        sbatch_args=settings.sbatch_args + tuple(args.sbatch_arg or ()),
    )
    gpus = args.gpus_per_shard if args.gpus_per_shard is not None else (gpus_default or 0)
    if gpus < 0:
        raise SlurmError(f"--gpus-per-shard {gpus}: must be >= 0 (0: CPU)")
    if args.shards < 1:
        raise SlurmError(f"--shards {args.shards}: must be at least 1")
    history = getattr(args, "history", HISTORY_TRUTH)
    name = args.ckpt + (RUN_DIR_SUFFIX if history == HISTORY_MODEL else "")
    out = Path(args.out).resolve() if args.out else (project / runs / name).resolve()
    _check_path(out)
    return Plan(
        ckpt=args.ckpt,
        shards=args.shards,
        gpus_per_shard=gpus,
        out=out,
        project=project,
        python=sys.executable,
        settings=settings,
        history=history,
    )


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
    data = _read_submission(out)
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
    earlier = _read_submission(plan.out) if (plan.slurm_dir / SUBMISSION).is_file() else {}
    dirs = [plan.out, *(plan.shard_dir(k) for k in range(1, plan.shards + 1))]
    for line in clear_stale_locks(dirs, runner, _job_ids(earlier)):
        print(line)
    _write_scripts(plan)
    jobs: list[dict[str, Any]] = []
    _submit_jobs(plan, runner, jobs, range(1, plan.shards + 1), resume=False)
    shards_job, merge_job = jobs[0]["job_id"], jobs[1]["job_id"]
    print(
        f"memeval slurm: submitted {plan.shards} shard(s) of {plan.ckpt} as array job "
        f"{shards_job} and the merge into {plan.out} as job {merge_job}"
    )
    print(f"memeval slurm: follow with: memeval slurm status {shlex.quote(str(plan.out))}")
    if args.wait:
        return wait(plan.out, runner, poll=args.poll)
    return 0


def _merge_state(data: Mapping[str, Any], runner: SlurmRunner) -> tuple[JobInfo | None, str]:
    merges = [j for j in data.get("jobs", []) if j.get("kind") == "merge"]
    if not merges:
        return None, ""
    job_id = str(merges[-1]["job_id"])
    records = runner.show_job(job_id)
    info = JobInfo.from_record(job_id, records[0]) if records else None
    return info, job_id


def _merged(out: Path) -> dict[str, Any] | None:
    try:
        metrics = read_json(out / METRICS)
    except (OSError, ValueError):
        return None
    if isinstance(metrics, dict) and metrics.get("complete") is True:
        return metrics
    return None


def report_status(out: Path, runner: SlurmRunner) -> tuple[list[ShardState], bool]:
    """Print the status table; returns the shard states and whether the merged run is there."""
    data = _read_submission(out)
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
    info, job_id = _merge_state(data, runner)
    merged = _merged(plan.out)
    failed = [f"{s.k}/{plan.shards}" for s in states if s.run == "failed"]
    if merged is not None and merged.get("merged_from") and (info is None or info.final):
        # (while the latest merge job waits, a metrics.json there is an earlier merge's)
        m1 = merged["m1"]
        what = f"done: {plan.out} n={merged['n']} m1={m1['correct']}/{m1['total']}"
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
        for text in _tail(log) or ["(no log)"]:
            print(f"      | {text}")
    done = merged is not None and bool(merged.get("merged_from"))
    return states, done and (info is None or info.state == "COMPLETED")


def wait(out: Path, runner: SlurmRunner, *, poll: float = 5.0) -> int:
    """Block until the latest merge job ends; 0 only if DIR/metrics.json is complete."""
    data = _read_submission(out)
    delay = min(1.0, poll)
    while True:
        info, _ = _merge_state(data, runner)
        if info is None or info.final:
            break
        time.sleep(delay)
        delay = min(poll, delay * 1.5)  # quick at first (short jobs), then every `poll` s
    states, merged = report_status(out, runner)
    if merged and info is not None and info.state == "COMPLETED":
        print(f"memeval slurm: merged run complete: {out}")
        return 0
    failed = [f"{s.k}/{len(states)}" for s in states if s.run != "done"]
    why = f"shard(s) not finished: {', '.join(failed)}" if failed else "the merge job failed"
    print(
        f"memeval slurm: no complete merged run in {out}: {why}; "
        f"see above, then: memeval slurm resubmit {shlex.quote(str(out))}",
        file=sys.stderr,
    )
    return 1


def resubmit(out: Path, runner: SlurmRunner, *, wait_after: bool, poll: float) -> int:
    """``memeval slurm resubmit DIR``: failed and missing shards (resumed), a new merge job."""
    data = _read_submission(out)
    plan = Plan.from_dict(data["plan"])
    jobs: list[dict[str, Any]] = list(data.get("jobs", []))
    states = shard_states(plan, jobs, runner.show_job)
    again = [s.k for s in states if s.needs_resubmit]
    info, merge_job = _merge_state(data, runner)
    if not again and _merged(plan.out) and (info is None or info.state == "COMPLETED"):
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
    for line in clear_stale_locks(dirs, runner, _job_ids(data)):
        print(line)
    _write_scripts(plan)  # the current scripts, as submit wrote them
    # Shards still pending or running keep their jobs; the new merge waits for them too (a
    # finished shard whose task is still checking its run included).
    after = [s.job.job_id for s in states if s.job and not s.job.final and s.k not in again]
    before = len(jobs)
    _submit_jobs(plan, runner, jobs, again, resume=True, after_tasks=after)
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


# -- command line -------------------------------------------------------------------------


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``memeval slurm submit|status|resubmit`` (and ``check-shard``, ``unfinished``: the
    shard task's own steps)."""
    sub = parser.add_subparsers(dest="slurm_command", required=True, metavar="ACTION")
    p = sub.add_parser(
        "submit",
        help="submit one array job (a task per shard) and the merge job",
        description="Submit --shards N shard runs of --ckpt NAME as one Slurm array job and a "
        "merge job that runs once every shard finished. Run it in the project directory (the "
        "one whose pyproject.toml holds the profile), on a filesystem every node sees.",
    )
    p.add_argument("--ckpt", required=True, metavar="NAME", help="checkpoint profile")
    p.add_argument("--shards", required=True, type=int, metavar="N", help="number of shards")
    p.add_argument(
        "--gpus-per-shard",
        type=int,
        default=None,
        metavar="G",
        help="GPUs per shard task, one xdist worker each (0: CPU, no xdist). Default: "
        "[tool.memeval.slurm] gpus_per_shard, else 0",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="merged run directory; shard runs go to DIR/shard-K-of-N, scripts and logs to "
        "DIR/slurm (default: runs/<ckpt> in the project)",
    )
    p.add_argument(
        "--history",
        choices=HISTORIES,
        default=HISTORY_TRUTH,
        help="truth (teacher-forced, the default) or model (free-running: each shard runs "
        "pytest --memeval-history model; default DIR runs/<ckpt>@history-model)",
    )
    p.add_argument("--project", default=".", metavar="DIR", help="project directory (default: .)")
    p.add_argument("--partition", default=None, help="sbatch --partition")
    p.add_argument("--time", default=None, help="sbatch --time, per shard task and merge job")
    p.add_argument("--account", default=None, help="sbatch --account")
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra sbatch option for both jobs, e.g. --sbatch-arg=--qos=high (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the scripts, submit nothing")
    _wait_args(p)

    s = sub.add_parser("status", help="each shard's job and run state, and the merge job's")
    s.add_argument("out", type=Path, metavar="DIR", help="the --out DIR of the submission")

    r = sub.add_parser("resubmit", help="resubmit failed or missing shards and a new merge job")
    r.add_argument("out", type=Path, metavar="DIR", help="the --out DIR of the submission")
    _wait_args(r)

    u = sub.add_parser(
        "unfinished", help="(inside a shard task) print the unfinished run to resume; 1 if none"
    )
    u.add_argument("shard_dir", type=Path, metavar="SHARD_DIR")

    c = sub.add_parser("check-shard", help="(inside a shard task) exit 0 iff the shard finished")
    c.add_argument("shard_dir", type=Path, metavar="SHARD_DIR")
    c.add_argument("--shard", required=True, metavar="K/N")
    c.add_argument("--pytest-exit", required=True, type=int, metavar="RC")


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        action="store_true",
        help="block until the merge job ends; exit 0 only if the merged run is complete",
    )
    p.add_argument(
        "--poll", type=float, default=10.0, metavar="S", help="--wait: poll Slurm at most every S s"
    )


def cli_main(args: argparse.Namespace, runner: SlurmRunner | None = None) -> int:
    """Run one ``memeval slurm`` action; 2 on a usage or Slurm error."""
    runner = runner or SlurmRunner()
    try:
        if args.slurm_command == "check-shard":
            try:
                k, n = parse_shard(args.shard)
            except ShardError as exc:
                print(f"memeval slurm check-shard: {exc}", file=sys.stderr)
                return 2
            code, line = check_shard(args.shard_dir.resolve(), k, n, args.pytest_exit)
            print(line, file=sys.stderr if code else sys.stdout)
            return code
        if args.slurm_command == "unfinished":
            unfinished = unfinished_run(args.shard_dir.resolve())
            if unfinished is None:
                return 1
            print(unfinished)
            return 0
        if args.slurm_command == "submit":
            return submit(args, runner)
        out = args.out.resolve()
        if args.slurm_command == "status":
            states, _ = report_status(out, runner)
            return 1 if any(s.run == "failed" for s in states) else 0
        return resubmit(out, runner, wait_after=args.wait, poll=args.poll)
    except SlurmError as exc:
        print(f"memeval slurm: {exc}", file=sys.stderr)
        return 2
