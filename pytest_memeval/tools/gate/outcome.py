"""A gate's verdict and how it sets the session's exit status, for every kind of run.

:class:`GateReporter` is the controller-side plugin both gates are (the scenario gate,
:class:`~pytest_memeval.tools.gate.plugin.MemevalGate`, and the closed-loop gate,
:class:`~pytest_memeval.tools.gate.episodes.EpisodeGate`): it holds the checks of the run
(:class:`GateOutcome`, also in ``config.stash[GATE_KEY]``), decides the exit status once, and
writes the ``memeval gate`` section of the terminal summary. Which failures a gate forgives
(the wrong answers, the failed episodes) and how it checks the run are each gate's own.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_memeval.tools.gate.checks import GateCheck

__all__ = ["GATE_KEY", "GateOutcome", "GateReporter"]


@dataclass
class GateOutcome:
    """All gate checks of the session (kept in ``config.stash[GATE_KEY]``)."""

    checks: list[GateCheck] = field(default_factory=list)
    #: Why a passing or failing verdict may not mean much (e.g. a max drop the sample
    #: cannot resolve); shown with the checks, never changing them.
    warnings: list[str] = field(default_factory=list)
    forgiven: int = 0
    exitstatus: int | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


GATE_KEY = pytest.StashKey[GateOutcome]()


class GateReporter:
    """Controller side of a gate: decides the exit status from its checks and reports them.

    A subclass fills ``outcome.checks`` once the run is written (setting ``wrote_run``),
    counts in ``outcome.forgiven`` the failures the gate decides instead of the items, and
    may override :meth:`run_finished` (called once, just before the verdict).
    """

    #: the check that fails when no run was written
    not_written = (
        "no run was written (no eval item ran, or the recount disagreed): a gate cannot "
        "pass without a complete run"
    )
    #: what the forgiven failures are, in the summary's words
    forgiven_words = "eval item failure(s) are wrong answers"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.outcome = GateOutcome()
        config.stash[GATE_KEY] = self.outcome
        self.wrote_run = False

    def run_finished(self, session: pytest.Session) -> None:
        """Hook for a subclass, called once before the verdict: the session's plain
        ``pytest_sessionfinish`` implementations (the controller's, which writes the run)
        have run by then (default: nothing to do)."""

    def decide(self, session: pytest.Session) -> int:
        """The session's exit status under the gate (computed once, then fixed).

        First called after every plain ``pytest_sessionfinish``: from the terminal summary
        (inside the terminal reporter's wrapper) or from this gate's own wrapper, whichever
        comes first."""
        if self.outcome.exitstatus is not None:
            return self.outcome.exitstatus
        self.run_finished(session)
        status = int(session.exitstatus)
        if not self.wrote_run:
            self.outcome.checks = [GateCheck("run written", False, self.not_written)]
        if status in (
            pytest.ExitCode.INTERRUPTED,
            pytest.ExitCode.INTERNAL_ERROR,
            pytest.ExitCode.USAGE_ERROR,
        ):
            decided = status  # never turned into a pass
        elif not self.outcome.passed:
            decided = int(pytest.ExitCode.TESTS_FAILED)
        else:
            others = session.testsfailed - self.outcome.forgiven
            decided = int(pytest.ExitCode.TESTS_FAILED if others > 0 else pytest.ExitCode.OK)
        self.outcome.exitstatus = decided
        return decided

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, object, object]:
        # A wrapper: the code after ``yield`` runs after every implementation, including the
        # controller's that writes the run.
        result = yield
        session.exitstatus = self.decide(session)
        return result

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        status = self.decide(self.session)
        tr.section("memeval gate")
        for warning in self.outcome.warnings:
            tr.line("WARN  " + warning, yellow=True)
        for check in self.outcome.checks:
            tr.line(
                ("PASS  " if check.passed else "FAIL  ") + check.detail,
                green=check.passed,
                red=not check.passed,
            )
        others = self.session.testsfailed - self.outcome.forgiven
        if self.outcome.forgiven:
            tr.line(
                f"{self.outcome.forgiven} {self.forgiven_words}: reported above, but under a "
                "gate the threshold decides the exit status"
            )
        if others > 0:
            tr.line(
                f"{others} other failure(s)/error(s) fail the session whatever the gate says",
                red=True,
            )
        verdict = "PASSED" if self.outcome.passed else "FAILED"
        tr.line(
            f"gate {verdict}: exit status {status}", bold=True, green=status == 0, red=status != 0
        )
