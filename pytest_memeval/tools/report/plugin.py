"""pytest-html integration: a memeval summary and a per-scenario extra in ``--html`` reports.

Active only when pytest-html is installed and ``--html`` is given: the summary (m1, m2 with
95% intervals, the gate's verdict) goes above the results table; each eval item's row gets an
extra with the final prompt's end, prediction against truth and the turn table. Both come from
autoescaped Jinja2 templates (``templates/summary.html``, ``scenario_detail.html``): every
piece of model or benchmark text is escaped, a prediction is data, never markup.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

import pytest

from pytest_memeval.compat.pytest import report_record
from pytest_memeval.core.records import Record
from pytest_memeval.runtime.worker import RECORD_KEY
from pytest_memeval.tools.gate import GATE_KEY
from pytest_memeval.tools.report.pieces import scenario_detail_html, summary_html

__all__ = ["MemevalHtml"]


class MemevalHtml:
    """Registered by :func:`pytest_configure` when pytest-html writes a report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        # Runs where the item runs (an xdist worker): the extra travels on the report as
        # plain data. pytest-html's own wrapper (tryfirst, outside this one) then keeps it.
        outcome = yield
        report = outcome.get_result()
        if report.when != "call":
            return
        record = report_record(report) or item.stash.get(RECORD_KEY, None)
        if not isinstance(record, dict):
            return
        from pytest_html import extras

        # scoring.score's Record, as plain data from the worker that ran the item.
        detail = scenario_detail_html(cast(Record, record))
        report.extras = [*getattr(report, "extras", []), extras.html(detail)]

    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
    ) -> None:
        controller = self.config.pluginmanager.get_plugin("memeval-controller")
        if controller is None:
            return
        metrics = getattr(controller, "metrics", None)
        gate = self.config.stash.get(GATE_KEY, None)
        prefix.append(summary_html(metrics, gate, getattr(controller, "run_dir", None)))


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("html"):
        return  # pytest-html is not installed (or disabled): nothing to integrate with
    if not config.getoption("htmlpath", None):
        return
    config.pluginmanager.register(MemevalHtml(config), "memeval-html")
