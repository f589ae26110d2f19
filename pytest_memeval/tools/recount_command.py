"""``memeval recount RUN_DIR``: the independent recount as a command.

The recount itself is plain data work and lives in :mod:`pytest_memeval.core.recount`;
this module is only its command line (arguments, printing, exit status), kept out of core/
so that core stays free of argparse and stdout. A closed-loop run (``metrics.json`` of kind
``episodes``) is recounted by ``core/episode_records.recount_episodes``: its numbers counted
again from ``predictions.jsonl``, every block that differs named.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_memeval.core.formatting import counts_text, shown_list
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.tools.compare import (
    CompareError,
    EpisodeRun,
    is_episode_run,
    read_episode_run,
    recount_episode_run,
)

__all__ = ["cli_arguments", "cli_main"]


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``recount`` subcommand's arguments to ``parser``."""
    parser.add_argument(
        "run_dir", type=Path, help="run directory (metrics.json + predictions.jsonl)"
    )


def _episode_counts(run: EpisodeRun) -> str:
    numbers = run.metrics["episodes"]
    success = numbers["success"]
    return (
        f"{numbers['episodes']} episode(s), success {success['correct']}/{success['total']}, "
        f"{len(run.metrics['slices'])} slice(s)"
    )


def _recount_episodes(run_dir: Path) -> int:
    """An episode run: its numbers counted again from its records (an incomplete run
    recounts too: completeness is not the recount's question)."""
    try:
        run = read_episode_run(run_dir)
        differences = recount_episode_run(run)
    except CompareError as exc:
        print(f"memeval recount: FAIL: {exc}", file=sys.stderr)
        return 1
    if differences:
        print(
            f"memeval recount: FAIL: {run_dir}: metrics.json differs from the recount of "
            f"predictions.jsonl in {shown_list(differences)}",
            file=sys.stderr,
        )
        return 1
    print(f"memeval recount: OK {run_dir}: {_episode_counts(run)}")
    return 0


def cli_main(args: argparse.Namespace) -> int:
    """Recount ``args.run_dir``: print OK and the counts (0), or FAIL and why (1)."""
    if is_episode_run(args.run_dir):
        return _recount_episodes(args.run_dir)
    try:
        recounted = recount_run(args.run_dir)
    except (RecountError, OSError) as exc:
        print(f"memeval recount: FAIL: {exc}", file=sys.stderr)
        return 1
    print(f"memeval recount: OK {args.run_dir}: {counts_text(recounted)}")
    return 0
