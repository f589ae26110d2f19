"""One run at a time per run directory: the ``memeval.lock`` file.

Two runs writing the same ``runs/<ckpt>/`` (two terminals, two CI jobs on a shared disk)
would interleave their journals and promote each other's files. The controller therefore
holds a lock on the run directory from configure to unconfigure:

* the lock is a small JSON file, ``<run dir>/memeval.lock``, naming the holder (pid, host,
  start time, command line, the directory it writes); it is written to a temporary sibling
  and *hard-linked* into place, so it appears atomically and whole, and creating it fails if
  any lock is there (``O_CREAT|O_EXCL`` where the file system has no hard links);
* a second run finds it and refuses before anything starts (usage error), naming the holder;
* a lock left by a process that is no longer running *on this host* (killed with SIGKILL, a
  machine that lost power) is stale: the next run reports it and takes it over. The holder's
  liveness is checked with ``kill(pid, 0)`` and, on Linux, the process start time recorded in
  the lock (a recycled pid is not mistaken for the holder). Take-overs happen under a
  ``memeval.lock.takeover`` directory (``mkdir`` is atomic), so two runs that find the same
  stale lock cannot both take it;
* a lock from another host cannot be checked from here: the refusal says to delete the file
  once that run is known to be gone. Inside a Slurm job the lock also records the job
  (``SLURM_JOB_ID``, the array job and task, ``SLURM_RESTART_COUNT``): a task that Slurm
  requeued (possibly onto another node) finds the lock of its own earlier incarnation (same
  job and task, lower restart count), which is stale, and takes it over. ``memeval slurm
  resubmit`` clears the lock of a job that Slurm reports ended (tools/slurm/locks.py).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LOCK_NAME",
    "LockHeld",
    "RunLock",
    "describe_holder",
    "holder_alive",
    "read_holder",
    "slurm_job",
    "slurm_job_name",
]

LOCK_NAME = "memeval.lock"
_TAKEOVER_SUFFIX = ".takeover"


class LockHeld(Exception):
    """Another run holds the run directory; the message names it and says what to do."""


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), on Linux; else ``None``.

    Together with the pid it identifies a process: pids are recycled, start times are not.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text("ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def slurm_job(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The Slurm job this process runs in (from its environment), ``None`` outside Slurm."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    return {
        key: env.get(var, "")
        for key, var in (
            ("job_id", "SLURM_JOB_ID"),
            ("array_job_id", "SLURM_ARRAY_JOB_ID"),
            ("array_task_id", "SLURM_ARRAY_TASK_ID"),
            ("restart_count", "SLURM_RESTART_COUNT"),
            ("cluster", "SLURM_CLUSTER_NAME"),
        )
    }


def _restarts(job: Mapping[str, Any]) -> int:
    try:
        return int(job.get("restart_count") or 0)
    except (TypeError, ValueError):
        return 0


def _requeued_from(holder: dict[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a later incarnation of the holder's Slurm job (requeued)."""
    theirs, mine = holder.get("slurm"), slurm_job(environ)
    if not isinstance(theirs, dict) or mine is None:
        return False
    same = all(
        str(theirs.get(key) or "") == mine[key]
        for key in ("job_id", "array_job_id", "array_task_id", "cluster")
    )
    # Slurm keeps the job id when it requeues a job and counts up SLURM_RESTART_COUNT: the
    # earlier incarnation is over (Slurm ended it before starting this one).
    return same and _restarts(theirs) < _restarts(mine)


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the lock holder still runs: ``None`` when this host cannot tell."""
    return _alive(holder)


def _alive(holder: dict[str, Any]) -> bool | None:
    if _requeued_from(holder):
        return False
    if holder.get("host") != socket.gethostname():
        return None
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    recorded = holder.get("proc_start")
    if recorded is not None:
        current = _proc_start(pid)
        if current is not None and current != recorded:
            return False  # the pid now belongs to another process
    return True


def read_holder(path: Path) -> dict[str, Any] | None:
    """The lock file's content, or ``None`` if it is absent; unreadable content is ``{}``."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host h [in Slurm job 7_2 (restart 0)] since 2026-12-01T15:30:12+00:00
    (pytest -n 2 --ckpt x)``."""
    if not holder:
        return "an unreadable lock (not written by pytest-memeval, or damaged)"
    argv = holder.get("argv")
    cmd = f" ({' '.join(str(a) for a in argv)[:200]})" if isinstance(argv, list) and argv else ""
    job = holder.get("slurm")
    in_job = (
        f" in Slurm job {slurm_job_name(job)} (restart {_restarts(job)})"
        if isinstance(job, dict)
        else ""
    )
    return (
        f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{in_job} "
        f"since {holder.get('started', '?')}{cmd}"
    )


def slurm_job_name(job: Mapping[str, Any]) -> str:
    """``7_2`` for task 2 of array job 7, else the job id (as ``squeue`` shows them)."""
    if job.get("array_job_id") and job.get("array_task_id"):
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job.get("job_id") or "?")


@dataclass
class RunLock:
    """A held lock on one run directory; :meth:`release` removes it (idempotent)."""

    path: Path
    holder: dict[str, Any]
    #: the stale lock this run took over, if any (to report it)
    took_over: dict[str, Any] | None = None
    #: the run directory did not exist before: remove it again if the run leaves it empty
    created_dir: bool = False
    released: bool = False

    @classmethod
    def acquire(cls, run_dir: Path, *, writes: Path | None = None) -> RunLock:
        """Take the lock on ``run_dir`` or raise :class:`LockHeld` naming the holder.

        ``writes`` is the directory the run will write (recorded so that a later run that
        finds this lock stale can say where the unfinished run is).
        """
        created_dir = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_NAME
        holder: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "proc_start": _proc_start(os.getpid()),
            "argv": list(sys.argv),
            "writes": str(writes) if writes is not None else None,
        }
        job = slurm_job()
        if job is not None:
            holder["slurm"] = job
        took_over: dict[str, Any] | None = None
        for _ in range(3):
            if _create(path, holder):
                return cls(path, holder, took_over=took_over, created_dir=created_dir)
            current = read_holder(path)
            if current is None:
                continue  # released between our attempt and the read: try again
            alive = _alive(current)
            if alive is False:
                if _take_over(path, current, holder):
                    took_over = current
                    return cls(path, holder, took_over=took_over, created_dir=created_dir)
                continue  # another run took it over first: look again
            raise LockHeld(_refusal(path, current, alive))
        current = read_holder(path) or {}
        raise LockHeld(_refusal(path, current, _alive(current)))

    def release(self) -> None:
        """Remove the lock if it is still ours (never another run's)."""
        if self.released:
            return
        self.released = True
        current = read_holder(self.path)
        if (
            current is not None
            and current.get("pid") == self.holder["pid"]
            and current.get("started") == self.holder["started"]
        ):
            self.path.unlink(missing_ok=True)
        if self.created_dir:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only if the run left nothing there


def _refusal(path: Path, holder: dict[str, Any], alive: bool | None) -> str:
    who = describe_holder(holder)
    if alive is None and holder and holder.get("host") != socket.gethostname():
        what = (
            f"that host cannot be checked from {socket.gethostname()}; if that run is gone, "
            f"delete {path} and run again"
        )
    elif not holder:
        what = f"if no run is using {path.parent}, delete {path} and run again"
    else:
        what = "wait for it to finish, or write this run elsewhere with --memeval-out DIR"
    return f"run directory {path.parent} is in use by another run: {who}; {what}"


def _create(path: Path, holder: dict[str, Any]) -> bool:
    """Create the lock file with ``holder`` atomically; ``False`` if a lock exists."""
    data = (json.dumps(holder, ensure_ascii=False) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            # link() fails if the target exists, and the lock appears with its content.
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
        # No hard links on this file system: exclusive create (content follows at once).
        try:
            lock_fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(lock_fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def _take_over(path: Path, stale: dict[str, Any], holder: dict[str, Any]) -> bool:
    """Replace the stale lock ``stale`` with ours; ``False`` if someone else got there first."""
    guard = path.with_name(path.name + _TAKEOVER_SUFFIX)
    try:
        guard.mkdir()
    except FileExistsError:
        # Another run is taking over right now; a guard older than a minute was left by a
        # run killed mid-take-over (the window is a few system calls): remove it.
        try:
            if time.time() - guard.stat().st_mtime > 60:
                guard.rmdir()
        except OSError:
            pass
        time.sleep(0.05)
        return False
    try:
        # Re-read under the guard: only replace the very lock we judged stale.
        if read_holder(path) != stale:
            return False
        path.unlink(missing_ok=True)
        return _create(path, holder)
    finally:
        guard.rmdir()
