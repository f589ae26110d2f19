"""The ``memeval`` command: work on run directories without pytest.

Each subcommand lives in the module that owns its concern and exposes two functions,
``cli_arguments(parser)`` and ``cli_main(args) -> int``; this file only dispatches, and
imports a subcommand's module only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "recount": (
        "pytest_memeval.tools.recount_command",
        "check metrics.json against predictions.jsonl",
    ),
    "merge": ("pytest_memeval.tools.merge", "merge complete shard runs into one run"),
    "compare": (
        "pytest_memeval.tools.compare",
        "compare two runs (m1/m2, intervals, McNemar, flips)",
    ),
    "report": (
        "pytest_memeval.tools.report",
        "write a self-contained HTML report of one or two runs",
    ),
    "known-failures": (
        "pytest_memeval.tools.known_failures",
        "list a run's failing eval items (for pytest --memeval-expect FILE)",
    ),
    "bench": ("pytest_memeval.tools.bench", "benchmark the fast decode path against the reference"),
    "slurm": (
        "pytest_memeval.tools.slurm",
        "submit shards to Slurm and merge them; status and resubmit of a submission",
    ),
}


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_text) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_text)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memeval", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in _available().items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.cli_arguments(p)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    result: int = module.cli_main(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
