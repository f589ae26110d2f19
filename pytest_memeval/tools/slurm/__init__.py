"""``memeval slurm``: shards as a Slurm array job, merged by a job (the command: :mod:`.command`).

One module a concern: :mod:`.jobs` runs Slurm's commands and reads its answers, :mod:`.plan`
the settings and the plan, :mod:`.scripts` the batch scripts, :mod:`.shards` a task's verdict
and each shard's state, :mod:`.locks` the locks of ended jobs, :mod:`.record`
``submission.json``, :mod:`.status` ``status`` and ``--wait``, :mod:`.submit` ``submit`` and
``resubmit``. This package's names are imported from here, never from its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.slurm.command import cli_arguments, cli_main
from pytest_memeval.tools.slurm.jobs import (
    FINAL_STATES,
    JobInfo,
    SlurmError,
    SlurmRunner,
    array_tasks,
    parse_scontrol,
    task_info,
)
from pytest_memeval.tools.slurm.locks import LockVerdict, clear_stale_locks, stale_lock
from pytest_memeval.tools.slurm.plan import (
    MERGE_SCRIPT,
    SHARDS_SCRIPT,
    SLURM_DIR,
    SUBMISSION,
    Plan,
    SlurmDefaults,
    SlurmSettings,
    load_settings,
    make_plan,
)
from pytest_memeval.tools.slurm.scripts import dependency, merge_script, shard_script
from pytest_memeval.tools.slurm.shards import (
    INCOMPLETE_EXIT,
    ShardState,
    ShardVerdict,
    check_shard,
    shard_states,
    unfinished_run,
)
from pytest_memeval.tools.slurm.status import StatusReport, report_status, wait
from pytest_memeval.tools.slurm.submit import resubmit, submit

__all__ = [
    "FINAL_STATES",
    "INCOMPLETE_EXIT",
    "MERGE_SCRIPT",
    "SHARDS_SCRIPT",
    "SLURM_DIR",
    "SUBMISSION",
    "JobInfo",
    "LockVerdict",
    "Plan",
    "ShardState",
    "ShardVerdict",
    "SlurmDefaults",
    "SlurmError",
    "SlurmRunner",
    "SlurmSettings",
    "StatusReport",
    "array_tasks",
    "check_shard",
    "clear_stale_locks",
    "cli_arguments",
    "cli_main",
    "dependency",
    "load_settings",
    "make_plan",
    "merge_script",
    "parse_scontrol",
    "report_status",
    "resubmit",
    "shard_script",
    "shard_states",
    "stale_lock",
    "submit",
    "task_info",
    "unfinished_run",
    "wait",
]
