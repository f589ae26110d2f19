"""Reports of runs: the ``memeval report`` HTML page (or its Markdown), and pytest-html's extras.

:mod:`.command` is the command (loading and writing, :func:`write_report`); the page's data
is gathered in :mod:`.model`, its charts' geometry in :mod:`.charts`, the pages rendered in
:mod:`.pages`; the Markdown of runs in :mod:`.markdown` (also the CI step summary's body);
pytest-html's summary and per-scenario extra in :mod:`.pieces`, put on pytest-html's page by
the plugin :mod:`.plugin`; a closed-loop run's page and Markdown in
:mod:`.episodes`. Markup in ``templates/``, CSS and JS in ``static/``, one Jinja2
environment in :mod:`.templating`. This package's names are imported from here, never from
its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.report.command import write_report
from pytest_memeval.tools.report.episodes import (
    episode_markdown,
    load_episode_run,
    render_episode_report,
)
from pytest_memeval.tools.report.markdown import (
    ROWS,
    TEXT_LIMIT,
    MarkdownRun,
    markdown_report,
    md_code,
    md_text,
    run_markdown,
)
from pytest_memeval.tools.report.pages import render_many, render_report
from pytest_memeval.tools.report.pieces import scenario_detail_html, summary_html
from pytest_memeval.tools.report.templating import environment, render, static_text

__all__ = [
    "ROWS",
    "TEXT_LIMIT",
    "MarkdownRun",
    "environment",
    "episode_markdown",
    "load_episode_run",
    "markdown_report",
    "md_code",
    "md_text",
    "render",
    "render_episode_report",
    "render_many",
    "render_report",
    "run_markdown",
    "scenario_detail_html",
    "static_text",
    "summary_html",
    "write_report",
]
