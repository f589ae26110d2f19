"""Wrong answers, one line each: an eval does not drown the terminal.

Wrong answers are expected in an eval: a 5,000-scenario run printed 3,670 failure reports
(a header, the message and the prompt's end each), which took longer to print than a fifth of
the run (docs/robustness.md). By default each wrong answer (an eval item that failed with
:class:`~pytest_memeval.evaluation.WrongAnswer`) is shown as one line, ``FAILED <node id> -
scenario <id>: expected ..., predicted ...``, in a "wrong answers" section instead of a full
report in FAILURES and a line in the short summary. The full record stays in
``predictions.jsonl``, JUnit XML and the HTML report.

pytest's usual ways to ask for more still give pytest's usual output: ``-v``, ``--tb=STYLE``
(any style given on the command line or in ``addopts``, ``auto`` excepted), ``-rA``, or
``--memeval-failures=full`` (ini ``memeval_failures``). Other failures and errors (a setup
error, a crashed worker, a failing non-eval test) are never shortened.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_memeval.runtime.assertions import WrongAnswer

__all__ = ["COMPACT_ATTR", "compact_active"]

#: Attribute a wrong answer's call report carries (plain str; it crosses xdist with the report).
COMPACT_ATTR = "memeval_wrong_answer"
MODES = ("compact", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-failures",
        dest="memeval_failures",
        choices=MODES,
        default=None,
        help="how wrong answers are shown: 'compact' (one line each: scenario, expected, "
        "predicted) or 'full' (pytest's failure report). Default: memeval_failures ini "
        "(compact); -v, --tb=STYLE and -rA also give full reports",
    )
    parser.addini(
        "memeval_failures", "how wrong answers are shown: compact or full", default="compact"
    )


def compact_active(config: pytest.Config) -> bool:
    """Whether wrong answers are shown one line each in this session."""
    mode = config.getoption("memeval_failures", None) or config.getini("memeval_failures")
    if mode not in MODES:
        raise pytest.UsageError(f"memeval_failures must be one of {MODES}, got {mode!r}")
    return (
        mode == "compact"
        and config.get_verbosity() <= 0
        and config.getoption("tbstyle", "auto") == "auto"
        and "A" not in (config.getoption("reportchars", "") or "")
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    if call.when != "call" or call.excinfo is None:
        return
    value = call.excinfo.value
    if isinstance(value, WrongAnswer):
        setattr(outcome.get_result(), COMPACT_ATTR, value.compact)


def pytest_configure(config: pytest.Config) -> None:
    if compact_active(config):
        config.pluginmanager.register(CompactWrongAnswers(), "memeval-compact-failures")


class CompactWrongAnswers:
    """Prints wrong answers one line each and keeps pytest from printing them again.

    The outermost wrapper of ``pytest_terminal_summary``: pytest's terminal reporter prints
    FAILURES (before its own yield) and the short summary (after it) from its ``stats``; the
    wrong answers are taken out of ``stats["failed"]`` for that time only and put back
    before the final counts line, so "N failed" and the exit status are unchanged.
    """

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None, Any, None]:
        tr = terminalreporter
        failed: list[Any] = tr.stats.get("failed", [])
        wrong = [r for r in failed if getattr(r, COMPACT_ATTR, None)]
        if not wrong:
            yield
            return
        tr.stats["failed"] = [r for r in failed if not getattr(r, COMPACT_ATTR, None)]
        try:
            tr.write_sep(
                "=",
                f"wrong answers: {len(wrong)} (one line each; -v or --memeval-failures=full "
                "for full reports)",
            )
            # One write for all the lines (thousands in a large eval).
            tr.write("".join(f"FAILED {r.nodeid} - {getattr(r, COMPACT_ATTR)}\n" for r in wrong))
            yield
        finally:
            tr.stats["failed"] = failed
