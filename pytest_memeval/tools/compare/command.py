"""``memeval compare RUN_A RUN_B [RUN ...]``: the command line of the comparison.

The whole-benchmark comparison (:mod:`pytest_memeval.tools.compare`), followed, when the runs'
scenarios carry tags, by the comparison slice by slice
(:mod:`pytest_memeval.tools.compare.slices`): ``--slice`` chooses the slices shown (they are
the family the p-values are adjusted over), ``--correction`` the adjustment. ``--json`` prints
the same as one object (the comparison's fields, plus ``slices``, and ``history``: the
teacher-forced/free-running facts of :mod:`pytest_memeval.tools.compare.history` when the two
runs are the two histories of one checkpoint, else null).

Closed-loop runs (``metrics.json`` of kind ``episodes``) are compared by
:mod:`pytest_memeval.tools.compare.episodes`: two runs of one environment and the same seeds,
paired by episode. Scenario runs and episode runs given together are set side by side by
:mod:`pytest_memeval.tools.compare.ways`: each model's teacher-forced, free-running and
closed-loop runs of the same seeds, paired by id (no test pairs an answer with a success).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pytest_memeval.tools.compare.board import compare_many
from pytest_memeval.tools.compare.episode_runs import check_same_kind, load_episode_run
from pytest_memeval.tools.compare.episode_text import format_episode_comparison
from pytest_memeval.tools.compare.episodes import compare_episode_runs
from pytest_memeval.tools.compare.history import format_history_pair, history_pair
from pytest_memeval.tools.compare.load import load_run
from pytest_memeval.tools.compare.pair import compare_runs
from pytest_memeval.tools.compare.slices import (
    compare_slices,
    format_slices,
    run_tags,
    slice_arguments,
)
from pytest_memeval.tools.compare.text import format_comparison, format_many
from pytest_memeval.tools.compare.types import CompareError
from pytest_memeval.tools.compare.ways import compare_ways, load_ways, mixes_kinds
from pytest_memeval.tools.compare.ways_text import format_ways

__all__ = ["cli_arguments", "cli_main"]


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``memeval compare``."""
    parser.add_argument(
        "run_a", type=Path, metavar="RUN_A", help="run directory A (the reference, the baseline)"
    )
    parser.add_argument(
        "runs",
        type=Path,
        nargs="+",
        metavar="RUN_B",
        help="run directory B (the candidate); several: each is compared with RUN_A, the "
        "p-values Holm-corrected, and a leaderboard sorts them by m1. Scenario runs and "
        "closed-loop runs together: each model's teacher-forced, free-running and closed-loop "
        "runs of the same seeds side by side",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    slice_arguments(parser)


def _episodes(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Two episode runs compared: the JSON object and the text."""
    if len(args.runs) > 1:
        raise CompareError(
            "several runs against one baseline is for scenario runs; compare episode runs "
            "two at a time (memeval compare RUN_A RUN_B)"
        )
    reference, run = load_episode_run(args.run_a), load_episode_run(args.runs[0])
    pair = compare_episode_runs(reference, run, slices=args.slices, method=args.correction)
    return dict(pair), format_episode_comparison(pair)


def _scenarios(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Scenario runs compared (a pair, or several against the first): JSON object and text."""
    reference = load_run(args.run_a)
    runs = [load_run(p) for p in args.runs]
    result: dict[str, Any]
    if len(runs) == 1:
        pair = compare_runs(reference, runs[0])
        result, text = dict(pair), format_comparison(pair)
        labels = [pair["a"]["label"], pair["b"]["label"]]
        # Teacher-forced against free-running (the same checkpoint): the gap, derailed.
        histories = history_pair(reference, runs[0], pair)
        result["history"] = histories
        if histories is not None:
            text += "\n\n" + "\n".join(format_history_pair(histories, pair["n"]))
    else:
        many = compare_many(reference, runs)
        result, text = dict(many), format_many(many)
        labels = [many["baseline"]["label"], *(p["b"]["label"] for p in many["runs"])]
    slices = None
    if args.slices or run_tags(reference, *runs):
        slices = compare_slices(reference, runs, labels, slices=args.slices, method=args.correction)
        text += "\n\n" + format_slices(slices)
    result["slices"] = slices
    return result, text


def cli_main(args: argparse.Namespace) -> int:
    """Run ``memeval compare``: 0 when compared, 2 when the runs cannot be compared."""
    try:
        if mixes_kinds([args.run_a, *args.runs]):
            ways = compare_ways(load_ways([args.run_a, *args.runs]), args.slices)
            result, text = dict(ways), format_ways(ways)
        elif check_same_kind([args.run_a, *args.runs]):
            result, text = _episodes(args)
        else:
            result, text = _scenarios(args)
    except CompareError as exc:
        print(f"memeval compare: refused: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else text)
    return 0
