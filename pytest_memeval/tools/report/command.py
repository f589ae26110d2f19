"""``memeval report RUN [RUN_B ...] -o report.html``: one self-contained HTML page.

With more than two runs, the page compares each with the first (the baseline): a
leaderboard, a forest plot of the m1 deltas with their paired intervals, and each run's
numbers and flipped scenarios on demand (``<details>``). With one or two, as follows.

The page holds the comparison table (m1/m2 with 95% Wilson intervals, unaligned, parse
failures, delta, divergent, the McNemar verdict), the flipped scenarios, inline SVG charts
(m1 and m2 with their intervals; m2 by turn position for each run) and a searchable table of
every scenario with its turns side by side. It loads nothing: no network, no CDN, one file
whose Content-Security-Policy allows only its own inline script (by hash) and style.

This module is the command: it loads the runs, has the page rendered and writes it. The
page's data is gathered in :mod:`.model`, its charts laid out in
:mod:`.charts`, and it is rendered in :mod:`.pages`; the markup lives in Jinja2
templates (``tools/report/templates/``), the stylesheet and the script in ``static/``
(inlined: the page stays one file). The templates are autoescaped
(:mod:`pytest_memeval.tools.report.templating`): all benchmark and model text is printed as text, so
a prediction that contains ``<script>`` is shown as those characters and never runs. The
renderers for pytest-html's summary and per-scenario extra (:mod:`.pieces`, used by
:mod:`pytest_memeval.tools.report.plugin`) are importable from here too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.tools.compare import (
    CompareError,
    compare_ways,
    is_episode_run,
    load_run,
    load_ways,
    mixes_kinds,
    slice_arguments,
)
from pytest_memeval.tools.report.episodes import (
    episode_markdown,
    load_episode_run,
    render_episode_report,
)
from pytest_memeval.tools.report.markdown import markdown_report
from pytest_memeval.tools.report.pages import render_many, render_report
from pytest_memeval.tools.report.pieces import scenario_detail_html, summary_html
from pytest_memeval.tools.report.ways import render_ways_report, ways_markdown

__all__ = [
    "cli_arguments",
    "cli_main",
    "render_many",
    "render_report",
    "scenario_detail_html",
    "summary_html",
    "write_report",
]


def write_report(
    paths: Sequence[Path], output: Path, *, slices: Sequence[str] = (), method: str = "holm"
) -> None:
    """Load, check and render runs into ``output`` (atomically; raises CompareError).

    One run: that run; two: A against B; more: each against the first (the baseline). An
    episode run (``metrics.json`` of kind ``episodes``) gets its own page, alone
    (:mod:`.episodes`); scenario runs and episode runs together, the three-ways page of each
    model (:mod:`.ways`).
    ``slices`` and ``method``: the per-slice comparison's slices and correction.
    """
    atomic_write(output, [_page(paths, slices=slices, method=method)])


def _episode_path(paths: Sequence[Path]) -> Path | None:
    """The one episode run among ``paths`` (its own page, :mod:`.episodes`), or None."""
    episodes = [p for p in paths if is_episode_run(p)]
    if not episodes:
        return None
    if len(paths) > 1:
        raise CompareError(
            f"{episodes[0]} is an episode run: memeval report shows one episode run at a time "
            "(compare episode runs with memeval compare)"
        )
    return episodes[0]


def _page(paths: Sequence[Path], *, slices: Sequence[str], method: str) -> str:
    if mixes_kinds(paths):
        ways = compare_ways(load_ways(paths), slices)
        return render_ways_report(ways, [str(p) for p in paths])
    episode_run = _episode_path(paths)
    if episode_run is not None:
        return render_episode_report(load_episode_run(episode_run))
    runs = [load_run(p) for p in paths]
    if len(runs) <= 2:
        return render_report(runs, slices=slices, method=method)
    return render_many(runs[0], runs[1:], slices=slices, method=method)


def _markdown(paths: Sequence[Path], *, slices: Sequence[str]) -> str:
    if mixes_kinds(paths):
        return ways_markdown(compare_ways(load_ways(paths), slices))
    episode_run = _episode_path(paths)
    if episode_run is None:
        return markdown_report(paths)
    run = load_episode_run(episode_run)
    return episode_markdown(run.label, run.path, run.metrics)


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``memeval report``."""
    parser.add_argument("run_a", type=Path, metavar="RUN", help="run directory (A, the baseline)")
    parser.add_argument(
        "runs",
        type=Path,
        metavar="RUN_B",
        nargs="*",
        default=[],
        help="second run directory (B), compared against A; several: each against A, on one "
        "page with a leaderboard and a forest plot",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="file to write (default: report.html; with --format markdown, standard output; "
        "'-': standard output)",
    )
    parser.add_argument(
        "--format",
        choices=("html", "markdown"),
        default="html",
        help="html (default): the self-contained page; markdown: the summary a CI job page or "
        "a pull-request comment shows (the one pytest appends to $GITHUB_STEP_SUMMARY)",
    )
    slice_arguments(parser)


def cli_main(args: argparse.Namespace) -> int:
    """Write the report: 0 on success, 2 when a run is refused."""
    paths = [args.run_a, *args.runs]
    markdown = args.format == "markdown"
    output = args.output or (Path("-") if markdown else Path("report.html"))
    try:
        if markdown:
            # Only the three-ways summary has a per-slice table (--slices); a scenario run's
            # has none yet (the HTML page has one).
            text = _markdown(paths, slices=args.slices)
        elif str(output) != "-":
            write_report(paths, output, slices=args.slices, method=args.correction)
        else:
            text = _page(paths, slices=args.slices, method=args.correction)
    except CompareError as exc:
        print(f"memeval report: refused: {exc}", file=sys.stderr)
        return 2
    if str(output) == "-":
        sys.stdout.write(text)
        return 0
    if markdown:
        atomic_write(output, [text])
    print(f"memeval report: wrote {output}")
    return 0
