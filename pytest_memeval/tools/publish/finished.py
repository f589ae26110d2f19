"""The end of a session: hand the finished run to whoever publishes it.

Teams read an eval's result where they already look: the CI job page (a Markdown step
summary), the JUnit XML their dashboards ingest, an experiment tracker. Each of those is an
implementation of one hook, ``pytest_memeval_run_finished(config, run)`` (hookspecs.py), which
this module calls once per session on the controller with a :class:`FinishedRun`: where the
run's files are, its metrics, the resolved profile, the gate's outcome and the session's exit
status. The bundled implementations are ``step_summary.py``, ``junit.py`` and
``tracking/mlflow.py``; a team's own plugin or ``conftest.py`` can add its own.

When: after every ``pytest_sessionfinish`` implementation (the controller has written and
recounted the run; pytest's junitxml and pytest-html have written their files) and before the
terminal summary, so each publisher's line (:func:`report_output`) is printed with it. That is
a ``trylast`` wrapper of ``pytest_sessionfinish``: wrappers run around the plain
implementations, and the ``trylast`` one innermost, inside the terminal reporter's (whose code
after ``yield`` prints the summary) and the gate's (which then sets the exit status it decided
here already, :meth:`MemevalGate.decide` being computed once).

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest

from pytest_memeval.core.episode_records import EpisodeRunMetrics
from pytest_memeval.core.profiles import Profile
from pytest_memeval.core.records import Metrics
from pytest_memeval.runtime.controller import MemevalController
from pytest_memeval.runtime.episodes import CONTROLLER_NAME as EPISODE_CONTROLLER
from pytest_memeval.runtime.episodes import EPISODE_STATE_KEY, EpisodeController
from pytest_memeval.runtime.state import STATE_KEY, is_worker
from pytest_memeval.tools.gate import EpisodeGate, GateOutcome, MemevalGate

__all__ = ["OUTPUTS_KEY", "FinishedRun", "Output", "report_output"]


@dataclass(frozen=True)
class FinishedRun:
    """A run the session wrote, as ``pytest_memeval_run_finished`` receives it."""

    #: the profile's name (``--ckpt``)
    ckpt: str
    #: where this run's files are: the top of the run directory for a finished run (it was
    #: promoted there), else its own ``subsets/<UTC time>/`` (docs/results-schema.md)
    run_dir: Path
    #: the run directory itself (``runs/<ckpt>``, ``--memeval-out``)
    run_root: Path
    #: ``metrics.json`` as written (recounted). For an episode run (:attr:`episodes` set) it
    #: is that run's ``metrics.json`` too, of kind ``"episodes"``: no ``m1``/``m2``, but
    #: ``kind``, ``profile``, ``complete`` and ``fingerprints`` as a scenario run's
    metrics: Metrics
    #: the profile as evaluated (command-line overrides applied)
    profile: Profile
    #: the session's exit status as it will be (the gate's decision when a gate is active)
    exitstatus: int
    #: the gate's checks and verdict, or None without a gate
    gate: GateOutcome | None = None
    #: ``--memeval-baseline``: the reference run the gate compared with
    baseline: Path | None = None
    #: pytest-html's report (``--html``), written by now, or None
    html_report: Path | None = None
    #: a closed-loop run's ``metrics.json`` (``EpisodeRunMetrics``, kind ``"episodes"``:
    #: success with its interval, score, steps, invalid actions, termination reasons, slices;
    #: docs/closed-loop.md), or None for a scenario run
    episodes: EpisodeRunMetrics | None = None

    @property
    def kind(self) -> str:
        """``"scenarios"`` or ``"episodes"`` (a closed-loop run: read :attr:`episodes`)."""
        return "scenarios" if self.episodes is None else "episodes"

    @property
    def complete(self) -> bool:
        """Every scenario of the benchmark has a result: not a ``-k``/``--lf`` subset, not a
        run with missing scenarios or one stopped early, not a shard (merge shards first)."""
        return self.metrics.get("complete") is True

    @property
    def label(self) -> str:
        """The run directory's name: the ckpt, with what was overridden (``oracle@ckpt-500-…``)."""
        return self.run_root.name


@dataclass(frozen=True)
class Output:
    """A line a publisher prints in the terminal summary (``problem``: in red)."""

    text: str
    problem: bool = False


OUTPUTS_KEY = pytest.StashKey[list[Output]]()


def report_output(config: pytest.Config, text: str, *, problem: bool = False) -> None:
    """Say in the terminal summary what a ``pytest_memeval_run_finished`` implementation
    published (``"memeval: step summary appended to ..."``), or why it could not."""
    config.stash.setdefault(OUTPUTS_KEY, []).append(Output(text, problem))


class _Publisher:
    """Calls ``pytest_memeval_run_finished`` once, at the end of the session (controller)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.called = False

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, object, object]:
        result = yield
        run = self._finished_run(session)
        if run is not None and not self.called:
            self.called = True
            _call_each(self.config, run)
        return result

    def _finished_run(self, session: pytest.Session) -> FinishedRun | None:
        episodes = self._finished_episodes(session)
        if episodes is not None:
            return episodes
        controller = self.config.pluginmanager.get_plugin("memeval-controller")
        state = self.config.stash.get(STATE_KEY, None)
        if not isinstance(controller, MemevalController) or state is None:
            return None
        if controller.metrics is None or controller.written is None:
            return None  # nothing written: no run to publish
        verdict = _gate_verdict(self.config, session)
        html = self.config.getoption("htmlpath", None)
        return FinishedRun(
            ckpt=state.profile.name,
            run_dir=controller.written,
            run_root=state.run_dir,
            metrics=controller.metrics,
            profile=state.profile,
            exitstatus=verdict.exitstatus,
            gate=verdict.outcome,
            baseline=verdict.baseline,
            html_report=_invocation_path(self.config, html) if html else None,
        )

    def _finished_episodes(self, session: pytest.Session) -> FinishedRun | None:
        """A closed-loop run's (its controller wrote the run directory), else None."""
        controller = self.config.pluginmanager.get_plugin(EPISODE_CONTROLLER)
        if (
            not isinstance(controller, EpisodeController)
            or controller.metrics is None
            or controller.written is None
        ):
            return None
        state = controller.state
        html = self.config.getoption("htmlpath", None)
        verdict = _gate_verdict(self.config, session)
        return FinishedRun(
            ckpt=state.profile.name,
            run_dir=controller.written,
            run_root=state.run_dir,
            # The same document, for implementations that read only what both kinds share.
            metrics=cast(Metrics, controller.metrics),
            profile=state.profile,
            exitstatus=verdict.exitstatus,
            gate=verdict.outcome,
            baseline=verdict.baseline,
            html_report=_invocation_path(self.config, html) if html else None,
            episodes=controller.metrics,
        )

    # trylast: after the memeval and gate sections, as pytest's own "generated xml file" line.
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for output in self.config.stash.get(OUTPUTS_KEY, []):
            terminalreporter.write_sep("-", output.text, red=output.problem, bold=output.problem)


class _GateVerdict(NamedTuple):
    """What the session's gate (a scenario or a closed-loop one) decided, if there is one."""

    exitstatus: int
    outcome: GateOutcome | None
    baseline: Path | None


def _gate_verdict(config: pytest.Config, session: pytest.Session) -> _GateVerdict:
    gate = config.pluginmanager.get_plugin("memeval-gate")
    if not isinstance(gate, (MemevalGate, EpisodeGate)):
        return _GateVerdict(int(session.exitstatus), None, None)
    baseline = gate.settings.baseline
    # Computed once: the gate's own wrapper sets this same status after us.
    return _GateVerdict(
        gate.decide(session), gate.outcome, baseline.path if baseline is not None else None
    )


def _invocation_path(config: pytest.Config, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(config.invocation_params.dir) / path


def _call_each(config: pytest.Config, run: FinishedRun) -> None:
    """Call every implementation, each on its own: one that raises (a tracker that is down,
    a bug in a team's plugin) is reported and does not keep the others from publishing.

    pluggy's own call would stop at the first exception; its public ``get_hookimpls`` gives
    the implementations in registration order, and pluggy calls the last one first.
    """
    hook = config.hook.pytest_memeval_run_finished
    args: dict[str, Any] = {"config": config, "run": run}
    impls = hook.get_hookimpls()
    calls: list[tuple[str, Callable[..., object], dict[str, Any]]]
    if any(impl.hookwrapper or impl.wrapper for impl in impls):
        calls = [("pytest_memeval_run_finished", hook, args)]  # pluggy's own call, as one
    else:
        calls = [
            (impl.plugin_name, impl.function, {n: args[n] for n in impl.argnames})
            for impl in reversed(impls)
        ]
    for who, function, kwargs in calls:
        try:
            function(**kwargs)
        except Exception as exc:
            report_output(
                config,
                f"memeval: pytest_memeval_run_finished of {who} failed: "
                f"{type(exc).__name__}: {exc} (the run and the exit status are unaffected)",
                problem=True,
            )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config):
        return  # workers publish nothing
    if STATE_KEY not in config.stash and EPISODE_STATE_KEY not in config.stash:
        return  # without --ckpt there is no run
    config.pluginmanager.register(_Publisher(config), "memeval-publisher")
