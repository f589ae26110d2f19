"""The CI gate of a closed-loop run: the success rate, not every failed episode, decides.

Options (on a run whose profile has an ``env`` table, docs/closed-loop.md):

* ``--memeval-min-success RATE`` (ini ``memeval_min_success``): the success rate must reach
  RATE (``0.85`` or ``85%``, exactly as ``--memeval-min-m1``);
* ``--memeval-baseline RUN --memeval-max-drop PP``: the success rate may fall at most PP
  percentage points below that of RUN, an episode run of the same environment and seeds
  (complete, and passing its recount: checked at start-up, before any model loads).

The exit status is decided as the scenario gate decides it
(:class:`~pytest_memeval.tools.gate.outcome.GateReporter`): a failed episode (the model did
not succeed) is reported but does not by itself fail the session; anything else does (an
environment error, any other test's failure, an interrupt). A gate never passes an
incomplete run: an episode that ended in an environment error, or one not run, fails the
gate with a line naming them. ``--memeval-min-m1``/``--memeval-min-m2`` on a closed-loop run,
a scenario run as its baseline, and a per-slice limit are usage errors.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.compat.pytest import report_record
from pytest_memeval.core.episode_records import EPISODE_RECORD_KIND, EpisodeRunMetrics
from pytest_memeval.core.stats import min_detectable_drop
from pytest_memeval.runtime.episodes import CONTROLLER_NAME, EPISODE_STATE_KEY, EpisodeController
from pytest_memeval.runtime.state import workerinput
from pytest_memeval.tools.compare import (
    EPISODES_KIND,
    CompareError,
    check_same_env,
    check_same_episodes,
    load_episode_run,
    read_metrics_kind,
    why_incomplete,
)
from pytest_memeval.tools.gate.checks import (
    GateCheck,
    drop_check,
    parse_pp,
    parse_rate,
    threshold_check,
)
from pytest_memeval.tools.gate.outcome import GateReporter

__all__ = [
    "MIN_SUCCESS",
    "EpisodeBaseline",
    "EpisodeGate",
    "EpisodeGateSettings",
    "configure_episode_gate",
    "episode_gate_options",
    "episode_gate_settings",
    "evaluate_episode_gate",
    "min_success_value",
]

#: the option of the closed-loop gate
MIN_SUCCESS = "--memeval-min-success"
_SCENARIO_ONLY = {"memeval_min_m1": "--memeval-min-m1", "memeval_min_m2": "--memeval-min-m2"}


def episode_gate_options(group: Any, parser: pytest.Parser) -> None:
    """``--memeval-min-success`` and its ini key (registered with the other gate options)."""
    group.addoption(
        MIN_SUCCESS,
        dest="memeval_min_success",
        metavar="RATE",
        default=None,
        help="gate of a closed-loop run: the success rate must reach RATE, e.g. 0.5 or 50%%; "
        "the exit status then follows the gate, not each failed episode",
    )
    parser.addini(
        "memeval_min_success",
        "gate of a closed-loop run: the success rate must reach this rate (--memeval-min-success)",
        default=None,
    )


def min_success_value(config: pytest.Config) -> str | None:
    """The ``--memeval-min-success`` value, else the ini key's (``None``: no such gate)."""
    given = config.getoption("memeval_min_success", None)
    if given:
        return str(given)
    ini = config.getini("memeval_min_success")
    return (str(ini).strip() or None) if ini else None


@dataclass(frozen=True)
class EpisodeBaseline:
    """The reference run of ``--memeval-baseline`` (an episode run), read at configure."""

    path: Path
    #: successes and scored episodes
    success: tuple[int, int]


@dataclass(frozen=True)
class EpisodeGateSettings:
    """The thresholds of a closed-loop session (``None``: that gate is off)."""

    min_success: Fraction | None = None
    baseline: EpisodeBaseline | None = None
    max_drop: Fraction = Fraction(0)

    @property
    def active(self) -> bool:
        return self.min_success is not None or self.baseline is not None


def _single(values: list[str] | None, option: str) -> str | None:
    """The one value of an option that may be repeated for slices (scenario runs)."""
    if not values:
        return None
    if len(values) > 1 or "=" in values[0]:
        raise pytest.UsageError(
            f"{option} {' '.join(values)}: per-slice limits are for scenario runs; a "
            "closed-loop run takes one value for the whole run"
        )
    return values[0]


def _load_baseline(path: Path, ids: list[str], env: Mapping[str, Any]) -> EpisodeBaseline:
    if read_metrics_kind(path) not in (None, EPISODES_KIND):
        raise pytest.UsageError(
            f"--memeval-baseline {path}: a scenario run; the baseline of a closed-loop run "
            "must be an episode run of the same environment and seeds"
        )
    try:
        run = load_episode_run(path)
        check_same_env(run.metrics["env"], env, "the baseline", "this run")
        check_same_episodes(list(run.records), ids, "the baseline", "this run")
    except CompareError as exc:
        raise pytest.UsageError(f"--memeval-baseline: {exc}") from None
    success = run.metrics["episodes"]["success"]
    return EpisodeBaseline(path=path, success=(success["correct"], success["total"]))


def episode_gate_settings(
    config: pytest.Config, ids: list[str], env: Mapping[str, Any]
) -> EpisodeGateSettings:
    """The gate settings of a closed-loop run of episodes ``ids`` in ``env``; raises
    :class:`pytest.UsageError` for a scenario gate option, a per-slice limit, a max drop
    without a baseline, and a baseline that is not a complete episode run of the same
    environment and seeds."""
    opt = config.getoption
    for dest, flag in _SCENARIO_ONLY.items():
        if opt(dest):
            raise pytest.UsageError(
                f"{flag} is for scenario runs; this is a closed-loop run (its profile has an "
                f"env): gate its success rate with {MIN_SUCCESS} RATE"
            )
    max_drop = _single(opt("memeval_max_drop"), "--memeval-max-drop")
    if max_drop and not opt("memeval_baseline"):
        raise pytest.UsageError(
            "--memeval-max-drop needs --memeval-baseline RUN to measure the drop from"
        )
    baseline = None
    if opt("memeval_baseline"):
        path = Path(opt("memeval_baseline"))
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
        baseline = _load_baseline(path, ids, env)
    minimum = min_success_value(config)
    return EpisodeGateSettings(
        min_success=parse_rate(minimum, MIN_SUCCESS) if minimum else None,
        baseline=baseline,
        max_drop=parse_pp(max_drop, "--memeval-max-drop") if max_drop else Fraction(0),
    )


def evaluate_episode_gate(
    settings: EpisodeGateSettings, metrics: EpisodeRunMetrics
) -> list[GateCheck]:
    """Check a written episode run's metrics against the gate settings."""
    checks: list[GateCheck] = []
    if metrics["complete"] is not True:
        checks.append(
            GateCheck(
                "complete run",
                False,
                f"complete run: the run is incomplete ({why_incomplete(metrics)}): a gate "
                "cannot pass it",
            )
        )
    success = metrics["episodes"]["success"]
    ours = (success["correct"], success["total"])
    if settings.min_success is not None:
        checks.append(threshold_check("success", *ours, settings.min_success))
    base = settings.baseline
    if base is not None:
        checks.append(drop_check("success", ours, base.success, base.path, settings.max_drop))
    return checks


def _resolution_warning(settings: EpisodeGateSettings) -> list[str]:
    """A max drop finer than the baseline's episodes can resolve (best case), as a warning."""
    base = settings.baseline
    if base is None or not base.success[1]:
        return []
    n, limit = base.success[1], float(settings.max_drop)
    best = min_detectable_drop(n)
    best_pp = 100.0 if best is None else best * 100
    if limit >= best_pp:
        return []
    return [
        f"--memeval-max-drop {limit:g} pp is smaller than what the baseline's {n} episodes "
        f"can resolve: at 80% power and alpha 0.05, no success drop under {best_pp:.1f} pp "
        "can be told from chance even if every changed episode got worse. The gate applies "
        "as written, but it may flap"
    ]


class EpisodeGate(GateReporter):
    """Controller side of a closed-loop gate: counts the failed episodes (forgiven), checks
    the run the episode controller wrote, sets the exit status."""

    not_written = "no run was written (no episode ran): a gate cannot pass without a complete run"
    forgiven_words = "episode failure(s) are episodes that did not succeed"

    def __init__(self, config: pytest.Config, settings: EpisodeGateSettings) -> None:
        super().__init__(config)
        self.settings = settings
        self.outcome.warnings = _resolution_warning(settings)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, None, None]:
        # A wrapper: the episode controller takes the record off the report when it has
        # journaled it; the record is read before that.
        record = report_record(report)
        if (
            report.failed
            and report.when == "call"
            and not hasattr(report, "wasxfail")
            and isinstance(record, dict)
            and record.get("kind") == EPISODE_RECORD_KIND
            and record.get("success") is False
            and record.get("reason") != "env_error"
        ):
            self.outcome.forgiven += 1
        return (yield)

    def run_finished(self, session: pytest.Session) -> None:
        controller = self.config.pluginmanager.get_plugin(CONTROLLER_NAME)
        if not isinstance(controller, EpisodeController) or controller.metrics is None:
            return
        self.wrote_run = True
        self.outcome.checks = evaluate_episode_gate(self.settings, controller.metrics)


def configure_episode_gate(config: pytest.Config) -> bool:
    """Register the gate of a closed-loop run on the controller; ``False`` for a run that is
    not one (the scenario gate's). Raises :class:`pytest.UsageError` for what must be fixed."""
    state = config.stash.get(EPISODE_STATE_KEY, None)
    if state is None:
        return False
    if config.getoption("memeval_expect", None):
        raise pytest.UsageError(
            "--memeval-expect is for scenario runs; a closed-loop run has no known-failure list yet"
        )
    if workerinput(config) is not None:
        return True  # the gate is the controller's
    settings = episode_gate_settings(config, state.ids(), state.env)
    if settings.active:
        config.pluginmanager.register(EpisodeGate(config, settings), "memeval-gate")
    return True
