"""The run's Markdown summary on the CI job page: ``$GITHUB_STEP_SUMMARY`` or a file.

GitHub Actions shows the Markdown a step appends to the file named by ``$GITHUB_STEP_SUMMARY``
on the job's page. When that variable is set, or ``--memeval-summary-md PATH`` (ini
``memeval_summary_md``) names a file, the controller appends the run's summary
(:func:`pytest_memeval.tools.report.markdown.run_markdown`: m1/m2 with intervals, completeness, the
gate's verdict and reasons, the comparison with ``--memeval-baseline``, the scenarios to look
at) once the session is over, as a ``pytest_memeval_run_finished`` implementation. ``off``
turns it off (also under GitHub Actions). Appended in one write, so two summaries (two runs
in one job step) never interleave. GitLab has no job-page Markdown: write the file with
``--memeval-summary-md`` and post it (docs/ci-and-tracking.md).

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_memeval.core.records import RecordError, read_records
from pytest_memeval.core.rundir import PREDICTIONS
from pytest_memeval.tools.compare import CompareError, compare_runs, load_run
from pytest_memeval.tools.publish.finished import FinishedRun, report_output
from pytest_memeval.tools.report import MarkdownRun, episode_markdown, run_markdown

__all__ = ["GITHUB_STEP_SUMMARY", "append_text", "finished_run_markdown", "summary_target"]

#: the environment variable GitHub Actions sets to the step's summary file
GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
#: the option value that writes no summary, even under GitHub Actions
OFF = "off"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-summary-md",
        dest="memeval_summary_md",
        metavar="PATH",
        default=None,
        help="append the run's Markdown summary (m1/m2, intervals, gate, comparison with the "
        "baseline) to PATH at the end of the session; default: $GITHUB_STEP_SUMMARY when set "
        "(GitHub Actions' job page); 'off': none. Default: memeval_summary_md ini.",
    )
    parser.addini(
        "memeval_summary_md",
        "file the run's Markdown summary is appended to (default $GITHUB_STEP_SUMMARY; 'off')",
        default=None,
    )


def summary_target(config: pytest.Config) -> Path | None:
    """Where this session's summary goes: the option, the ini value, else
    ``$GITHUB_STEP_SUMMARY``; ``None`` for ``off`` or when none is set. A relative path is
    relative to the directory pytest was started in."""
    value = config.getoption("memeval_summary_md", None) or config.getini("memeval_summary_md")
    if value:
        if str(value).strip().lower() == OFF:
            return None
        path = Path(str(value)).expanduser()
        return path if path.is_absolute() else Path(config.invocation_params.dir) / path
    env = os.environ.get(GITHUB_STEP_SUMMARY)
    return Path(env) if env else None


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` in one write (``O_APPEND``), synced; the parent directory
    is created if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def finished_run_markdown(run: FinishedRun) -> str:
    """The Markdown summary of a finished session's run (with its gate and baseline); of an
    episode run, its numbers and slices (:func:`~pytest_memeval.tools.report.episode_markdown`)."""
    if run.episodes is not None:
        return episode_markdown(
            run.label, run.run_dir, run.episodes, exitstatus=run.exitstatus, gate=run.gate
        )
    records = {rec["id"]: rec for rec in read_records(run.run_dir / PREDICTIONS)}
    this = MarkdownRun(run.label, run.run_dir, run.metrics, records)
    baseline = pair = None
    why_not = None
    if run.baseline is not None:
        if not run.complete:
            why_not = "this run is incomplete, and only complete runs are compared"
        else:
            try:
                base_data = load_run(run.baseline)
                pair = compare_runs(base_data, load_run(run.run_dir))
                baseline = MarkdownRun(
                    base_data.ckpt, run.baseline, base_data.metrics, base_data.records
                )
            except CompareError as exc:
                why_not = str(exc)
    return run_markdown(
        this,
        gate=run.gate,
        exitstatus=run.exitstatus,
        baseline=baseline,
        pair=pair,
        no_comparison=why_not,
    )


def pytest_memeval_run_finished(config: pytest.Config, run: FinishedRun) -> None:
    target = summary_target(config)
    if target is None:
        return
    where = (
        f"${GITHUB_STEP_SUMMARY} ({target})"
        if os.environ.get(GITHUB_STEP_SUMMARY) == str(target)
        else str(target)
    )
    try:
        text = finished_run_markdown(run)
        append_text(target, text + "\n")
    except (OSError, RecordError, UnicodeDecodeError) as exc:
        report_output(
            config, f"memeval: could not write the summary to {where}: {exc}", problem=True
        )
        return
    report_output(config, f"memeval: Markdown summary appended to {where}")
