"""Slurm itself, for ``memeval slurm``: the one runner of its client commands and the readers
of its answers.

:class:`SlurmRunner` is the only place that runs ``sbatch``, ``scontrol`` and ``scancel``;
everything that reads what they print (``scontrol -o show job`` records, array task ranges,
a job's state as :class:`JobInfo`) is a pure function. :class:`SlurmError` is the error of
every ``memeval slurm`` module.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "FINAL_STATES",
    "JobInfo",
    "SlurmError",
    "SlurmRunner",
    "array_tasks",
    "parse_scontrol",
    "task_info",
]

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


class SlurmError(Exception):
    """A Slurm command failed, or the submission cannot go ahead; the message says why."""


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
