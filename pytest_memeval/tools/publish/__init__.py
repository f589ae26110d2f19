"""Publishing a finished run: the hook ``pytest_memeval_run_finished`` and its bundled
implementations, each a pytest plugin that runs at the end of every session.

:mod:`.finished` calls the hook after the session (:class:`FinishedRun` is its argument,
:func:`report_output` a line in the terminal summary); the implementations: the Markdown job
summary :mod:`.step_summary`, JUnit properties :mod:`.junit`, the trackers in
:mod:`.tracking`. This package's names are imported from here, never from its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.publish.finished import FinishedRun, Output, report_output
from pytest_memeval.tools.publish.junit import (
    VALUE_LIMIT,
    add_suite_properties,
    case_properties,
    episode_suite_properties,
    suite_properties,
)
from pytest_memeval.tools.publish.step_summary import finished_run_markdown

__all__ = [
    "VALUE_LIMIT",
    "FinishedRun",
    "Output",
    "add_suite_properties",
    "case_properties",
    "episode_suite_properties",
    "finished_run_markdown",
    "report_output",
    "suite_properties",
]
