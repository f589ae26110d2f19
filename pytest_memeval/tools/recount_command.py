"""``memeval recount RUN_DIR``: the independent recount as a command.

The recount itself is plain data work and lives in :mod:`pytest_memeval.core.recount`;
this module is only its command line (arguments, printing, exit status), kept out of core/
so that core stays free of argparse and stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_memeval.core.formatting import counts_text
from pytest_memeval.core.recount import RecountError, recount_run

__all__ = ["cli_arguments", "cli_main"]


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``recount`` subcommand's arguments to ``parser``."""
    parser.add_argument(
        "run_dir", type=Path, help="run directory (metrics.json + predictions.jsonl)"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Recount ``args.run_dir``: print OK and the counts (0), or FAIL and why (1)."""
    try:
        recounted = recount_run(args.run_dir)
    except (RecountError, OSError) as exc:
        print(f"memeval recount: FAIL: {exc}", file=sys.stderr)
        return 1
    print(f"memeval recount: OK {args.run_dir}: {counts_text(recounted)}")
    return 0
