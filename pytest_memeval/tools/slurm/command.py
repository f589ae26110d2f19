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
Everything that builds scripts or reads Slurm's answers is a pure function (unit-tested);
``sbatch``/``scontrol``/``scancel`` are called only through :class:`SlurmRunner`.
Slurm facts this relies on: the default ``--export=ALL`` hands the submitting shell's
environment to the job (``PATH``, a virtualenv), and an array task's ``CUDA_VISIBLE_DEVICES``
lists the GPUs it was allocated, which the plugin's worker binding splits one per worker.

This module is the command line (``cli_arguments``, ``cli_main``); the work is done by the
package's modules, one concern each (see the package's docstring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_memeval.core.history import HISTORIES, HISTORY_TRUTH
from pytest_memeval.core.sharding import ShardError, parse_shard
from pytest_memeval.tools.slurm.jobs import (
    SlurmError,
    SlurmRunner,
)
from pytest_memeval.tools.slurm.shards import (
    check_shard,
    unfinished_run,
)
from pytest_memeval.tools.slurm.status import report_status
from pytest_memeval.tools.slurm.submit import resubmit, submit

__all__ = ["cli_arguments", "cli_main"]


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
    _submit_arguments(p)

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


def _submit_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``memeval slurm submit``."""
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
            verdict = check_shard(args.shard_dir.resolve(), k, n, args.pytest_exit)
            print(verdict.line, file=sys.stderr if verdict.code else sys.stdout)
            return verdict.code
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
            states = report_status(out, runner).states
            return 1 if any(s.run == "failed" for s in states) else 0
        return resubmit(out, runner, wait_after=args.wait, poll=args.poll)
    except SlurmError as exc:
        print(f"memeval slurm: {exc}", file=sys.stderr)
        return 2
