"""CI gates: let the session's exit status follow a threshold, not every wrong answer.

A model is never perfect, so "every eval item passed" is the wrong CI criterion. Options:

* ``--memeval-min-m1 RATE`` / ``--memeval-min-m2 RATE``: m1 (m2) must reach RATE (``0.85`` or
  ``85%``);
* ``--memeval-baseline RUN --memeval-max-drop PP``: m1 (and m2, where both runs score turns)
  may fall at most PP percentage points below the reference run's (default 0);
* on a closed-loop run, ``--memeval-min-success RATE`` and the baseline's success rate
  (:mod:`pytest_memeval.tools.gate.episodes`, which this module's ``pytest_configure`` hands
  such a run to);
* ``--memeval-expect RUN|FILE``: the eval items that failed in a reference run (or are listed
  in a committed file) are marked ``xfail(strict=False)``: only new failures fail, fixed ones
  show as XPASS.

Exit status under a threshold gate (min-m1, min-m2 or baseline): an eval item that failed
because the model answered wrong is reported as usual but does not by itself fail the
session: the gate decides. Everything else still does: a failure or error of any other item,
an eval item failing without a wrong answer (a setup error, a crashed worker, a checkpoint
that cannot load), an interrupted session. A gate never passes an incomplete run (missing
scenarios, a ``-k`` subset, a shard) or one whose recount disagreed: no complete run, no pass.

The gate runs on the controller only, from ``pytest_memeval_run_written`` (the run directory
is final). ``--memeval-expect`` is read once on the controller and handed to xdist workers as
a list of item names (plain data), where the markers are applied at collection.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_memeval.compat.pytest import report_record
from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.history import history_of, history_words
from pytest_memeval.core.ids import item_name
from pytest_memeval.core.records import Metrics, RateBlock, Record, read_records
from pytest_memeval.core.rundir import PREDICTIONS
from pytest_memeval.core.stats import mde_paired_binary, min_detectable_drop
from pytest_memeval.core.tags import slice_order
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.state import STATE_KEY, MemevalState, workerinput
from pytest_memeval.tools.compare import CompareError, is_episode_run, load_run
from pytest_memeval.tools.gate.checks import (
    GateCheck,
    drop_check,
    parse_pp,
    parse_rate,
    threshold_check,
)
from pytest_memeval.tools.gate.episodes import (
    MIN_SUCCESS,
    configure_episode_gate,
    episode_gate_options,
)
from pytest_memeval.tools.gate.known_failures import ExpectError, load_known_failures
from pytest_memeval.tools.gate.outcome import GateReporter
from pytest_memeval.tools.gate.slices import (
    Outcome,
    SliceGates,
    evaluate_slice_gates,
    outcomes,
    slice_limits,
    slice_warnings,
    split_values,
)

__all__ = [
    "Baseline",
    "GateSettings",
    "MemevalGate",
    "evaluate_gate",
    "resolution_warnings",
    "wrong_answer",
]

_EXPECT_OPTS = ("memeval_expect",)
_GATE_OPTS = (
    "memeval_min_m1",
    "memeval_min_m2",
    "memeval_min_success",
    "memeval_baseline",
    "memeval_max_drop",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-min-m1",
        dest="memeval_min_m1",
        metavar="RATE",
        action="append",
        default=None,
        help="gate: m1 (final-query accuracy) must reach RATE, e.g. 0.85 or 85%%; the exit "
        "status then follows the gate, not each wrong answer. SLICE=RATE gates a slice "
        "(query:door-state=0.8; a tag, a glob or TAG&TAG); repeatable",
    )
    group.addoption(
        "--memeval-min-m2",
        dest="memeval_min_m2",
        metavar="RATE",
        action="append",
        default=None,
        help="gate: m2 (turn-level accuracy over aligned scenarios) must reach RATE; "
        "SLICE=RATE gates a slice; repeatable",
    )
    episode_gate_options(group, parser)
    group.addoption(
        "--memeval-baseline",
        dest="memeval_baseline",
        metavar="RUN",
        default=None,
        help="gate: reference run directory; m1 (and m2) may drop at most --memeval-max-drop "
        "percentage points below it (a closed-loop run: its success rate, against an "
        "episode run)",
    )
    group.addoption(
        "--memeval-max-drop",
        dest="memeval_max_drop",
        metavar="PP",
        action="append",
        default=None,
        help="largest allowed drop against --memeval-baseline, in percentage points (default "
        "0); SLICE=PP limits a slice's drop; repeatable",
    )
    group.addoption(
        "--memeval-expect",
        dest="memeval_expect",
        metavar="RUN|FILE",
        default=None,
        help="known failures: the eval items that failed in this run directory (or are "
        "listed in FILE, see 'memeval known-failures') are xfail (not strict)",
    )


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    """The reference run of ``--memeval-baseline``, read once at configure time."""

    path: Path
    m1: tuple[int, int]
    m2: tuple[int, int]
    #: Each scenario's m1 outcome in the baseline (for the discordance of a paired run).
    m1_outcomes: Mapping[str, bool] = field(default_factory=dict)
    #: Each scenario's outcomes and tags in the baseline (for the per-slice gates).
    outcomes: Mapping[str, Outcome] = field(default_factory=dict)


@dataclass(frozen=True)
class GateSettings:
    """The thresholds of this session (``None``: that gate is off)."""

    min_m1: Fraction | None = None
    min_m2: Fraction | None = None
    baseline: Baseline | None = None
    max_drop: Fraction = Fraction(0)
    #: the per-slice gates (``SLICE=VALUE``; gate/slices.py)
    slices: SliceGates = field(default_factory=SliceGates)

    @property
    def active(self) -> bool:
        return (
            self.min_m1 is not None
            or self.min_m2 is not None
            or self.baseline is not None
            or self.slices.active
        )


def _load_baseline(path: Path, state: MemevalState) -> Baseline:
    if is_episode_run(path):
        raise pytest.UsageError(
            f"--memeval-baseline {path}: an episode run (closed loop); the baseline of a "
            "scenario run must be a scenario run of the same benchmark"
        )
    try:
        run = load_run(path)
    except CompareError as exc:
        raise pytest.UsageError(f"--memeval-baseline: {exc}") from None
    theirs_history = history_of(run.metrics)
    if theirs_history != state.history:
        raise pytest.UsageError(
            f"--memeval-baseline {path}: the baseline is {history_words(theirs_history)} "
            f"(history {theirs_history}) and this run {history_words(state.history)} "
            f"(--memeval-history {state.history}); a drop measured across the two mixes the "
            "cost of free-running into the regression. Gate against a baseline of the same "
            "history (memeval compare shows the gap between the two)"
        )
    ours, theirs = set(state.scope_ids), set(run.records)
    if ours != theirs:
        only_ours = sorted(ours - theirs)
        only_theirs = sorted(theirs - ours)
        raise pytest.UsageError(
            f"--memeval-baseline {path}: the baseline covers different scenarios than this "
            f"run's benchmark ({len(only_ours)} only here: {shown_ids(only_ours)}; "
            f"{len(only_theirs)} only in the baseline: {shown_ids(only_theirs)})"
        )
    m = run.metrics
    return Baseline(
        path=path,
        m1=(m["m1"]["correct"], m["m1"]["total"]),
        m2=(m["m2"]["correct"], m["m2"]["total"]),
        m1_outcomes={sid: rec["final_match"] is True for sid, rec in run.records.items()},
        outcomes=outcomes(run.records.values()),
    )


def _settings(config: pytest.Config, state: MemevalState) -> GateSettings:
    opt = config.getoption
    min_m1, m1_slices = split_values(opt("memeval_min_m1"), "--memeval-min-m1")
    min_m2, m2_slices = split_values(opt("memeval_min_m2"), "--memeval-min-m2")
    max_drop, drop_slices = split_values(opt("memeval_max_drop"), "--memeval-max-drop")
    baseline_text = opt("memeval_baseline")
    if opt("memeval_max_drop") and not baseline_text:
        raise pytest.UsageError(
            "--memeval-max-drop needs --memeval-baseline RUN to measure the drop from"
        )
    baseline = None
    if baseline_text:
        path = Path(baseline_text)
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
        baseline = _load_baseline(path, state)
    # A slice is named by a tag of this run's benchmark or of the baseline's records.
    known = slice_order(
        [*state.benchmark.tags]
        + [t for o in (baseline.outcomes.values() if baseline else ()) for t in o.tags]
    )
    return GateSettings(
        min_m1=parse_rate(min_m1, "--memeval-min-m1") if min_m1 else None,
        min_m2=parse_rate(min_m2, "--memeval-min-m2") if min_m2 else None,
        baseline=baseline,
        max_drop=parse_pp(max_drop, "--memeval-max-drop") if max_drop else Fraction(0),
        slices=SliceGates(
            min_m1=slice_limits(m1_slices, known, "--memeval-min-m1", parse_rate),
            min_m2=slice_limits(m2_slices, known, "--memeval-min-m2", parse_rate),
            max_drop=slice_limits(drop_slices, known, "--memeval-max-drop", parse_pp),
        ),
    )


# -- evaluation ----------------------------------------------------------------------------


def _threshold(name: str, block: RateBlock, minimum: Fraction) -> GateCheck:
    return threshold_check(name, block["correct"], block["total"], minimum)


def _drop(
    name: str, block: RateBlock, ref: tuple[int, int], path: Path, max_drop: Fraction
) -> GateCheck:
    return drop_check(name, (block["correct"], block["total"]), ref, path, max_drop)


def evaluate_gate(settings: GateSettings, metrics: Metrics) -> list[GateCheck]:
    """Check a written run's metrics against the gate settings."""
    checks: list[GateCheck] = []
    if metrics.get("complete") is not True:
        checks.append(
            GateCheck(
                "complete run",
                False,
                "complete run: the run is incomplete (missing scenarios, a subset or a shard): "
                "a gate cannot pass it",
            )
        )
    if settings.min_m1 is not None:
        checks.append(_threshold("m1", metrics["m1"], settings.min_m1))
    if settings.min_m2 is not None:
        checks.append(_threshold("m2", metrics["m2"], settings.min_m2))
    base = settings.baseline
    if base is not None:
        checks.append(_drop("m1", metrics["m1"], base.m1, base.path, settings.max_drop))
        if base.m2[1] and metrics["m2"]["total"]:
            checks.append(_drop("m2", metrics["m2"], base.m2, base.path, settings.max_drop))
    return checks


def resolution_warnings(
    settings: GateSettings, run_outcomes: Mapping[str, bool] | None = None
) -> list[str]:
    """Warnings when ``--memeval-max-drop`` is finer than the baseline's sample can resolve.

    Before the run: the best case of Connor's formula (every changed scenario changed the
    same way, :func:`~pytest_memeval.core.stats.min_detectable_drop`) for the baseline's number
    of scenarios. After it (``run_outcomes``: this run's m1 outcome per scenario): the
    minimum detectable difference at the observed share of changed scenarios. The gate is
    applied as written either way; the warning says why its verdict may flap.
    """
    base = settings.baseline
    if base is None or not base.m1[1]:
        return []
    n = base.m1[1]
    limit = float(settings.max_drop)
    out = []
    best = min_detectable_drop(n)
    best_pp = 100.0 if best is None else best * 100
    if limit < best_pp:
        out.append(
            f"--memeval-max-drop {limit:g} pp is smaller than what the baseline's {n} "
            f"scenarios can resolve: at 80% power and alpha 0.05, no m1 drop under "
            f"{best_pp:.1f} pp can be told from chance even if every changed scenario got "
            "worse. The gate applies as written, but it may flap: a few scenarios flipping "
            "by chance move m1 by more than the limit"
        )
    if run_outcomes:
        changed = sum(
            1
            for sid, ok in run_outcomes.items()
            if sid in base.m1_outcomes and base.m1_outcomes[sid] != ok
        )
        mde = mde_paired_binary(n, changed / n) if changed else None
        if mde is not None and limit < mde * 100:
            out.append(
                f"this run against the baseline: {changed} of {n} scenarios changed their m1 "
                f"outcome; at that rate differences under {mde * 100:.1f} pp are not "
                f"detectable (80% power, alpha 0.05), so a limit of {limit:g} pp is below the "
                "noise of this comparison"
            )
    return out


def wrong_answer(record: Record) -> bool:
    """Whether a scenario record holds a wrong answer (final or an aligned turn)."""
    if record.get("final_match") is not True:
        return True
    return bool(record.get("aligned")) and any(
        t.get("match") is False for t in record.get("turns", ())
    )


class MemevalGate(GateReporter):
    """Controller side: counts forgiven failures, checks the run, sets the exit status
    (:class:`~pytest_memeval.tools.gate.outcome.GateReporter`)."""

    def __init__(
        self,
        config: pytest.Config,
        settings: GateSettings,
        run_tags: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        super().__init__(config)
        self.settings = settings
        #: each in-scope scenario's tags in this run's benchmark (per-slice warnings)
        self.run_tags: Mapping[str, frozenset[str]] = run_tags or {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Mirror the session's own count (failed and not xfail) for eval items whose call
        # failed on a wrong answer: those are the ones the gate, not the item, decides.
        if not report.failed or hasattr(report, "wasxfail") or report.when != "call":
            return
        # The record rides only on eval items' call reports (worker.py), so its presence is
        # what identifies an eval item here.
        record = report_record(report)
        # scoring.score's Record, as plain data from the worker that ran the item.
        if isinstance(record, dict) and wrong_answer(cast(Record, record)):
            self.outcome.forgiven += 1

    def pre_run_warnings(self) -> list[str]:
        """What the sample sizes alone say, before the run (whole benchmark, then slices)."""
        base = self.settings.baseline
        return resolution_warnings(self.settings) + slice_warnings(
            self.settings.slices, self.run_tags, base.outcomes if base is not None else None
        )

    def pytest_memeval_run_written(self, run_dir: Path, metrics: Metrics) -> None:
        self.wrote_run = True
        self.outcome.checks = evaluate_gate(self.settings, metrics)
        slices, base = self.settings.slices, self.settings.baseline
        if base is None and not slices.active:
            return
        # finalize_run wrote these predictions atomically and recounted them (reading and
        # validating the same file) just before this hook: a RecordError or
        # UnicodeDecodeError now is a bug in the plugin and propagates. An OSError means the
        # run directory broke under this session: the whole-benchmark checks stand (the
        # resolution warning is advisory, so it is said, not hidden), and a per-slice gate,
        # which needs the records, fails: it could not be checked.
        path = run_dir / PREDICTIONS
        try:
            run = outcomes(read_records(path))
        except OSError as exc:
            self.outcome.warnings = [
                *self.pre_run_warnings(),
                f"could not re-read {path} for the resolution check after the run "
                f"({type(exc).__name__}: {exc}); only the pre-run estimate is shown",
            ]
            if slices.active:
                self.outcome.checks.append(
                    GateCheck(
                        "slices",
                        False,
                        f"slices: could not re-read {path} ({type(exc).__name__}): the "
                        "per-slice gates cannot be checked",
                    )
                )
            return
        base_outcomes = base.outcomes if base is not None else None
        self.outcome.checks += evaluate_slice_gates(
            slices, run, base_outcomes, base.path if base is not None else None
        )
        self.outcome.warnings = resolution_warnings(
            self.settings, {sid: o.final_ok for sid, o in run.items()}
        ) + slice_warnings(slices, self.run_tags, base_outcomes, run)


# -- expected failures ---------------------------------------------------------------------


class ExpectMarker:
    """Marks the known-failure eval items xfail (strict=False) at collection, in every process."""

    def __init__(self, names: list[str], source: str) -> None:
        self.names = set(names)
        self.source = source
        self.marked = 0

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            sid = scenario_param(item)
            if sid is None:
                continue
            name = item_name(getattr(item, "originalname", item.name), sid)
            if name in self.names:
                item.add_marker(
                    pytest.mark.xfail(reason=f"known failure (in {self.source})", strict=False)
                )
                self.marked += 1


class _ExpectToWorkers:
    """Registered only with xdist: hands the known-failure names to each worker."""

    def __init__(self, names: list[str], source: str) -> None:
        self.names = names
        self.source = source

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["memeval_known_failures"] = list(self.names)
        node.workerinput["memeval_known_failures_source"] = self.source


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if configure_episode_gate(config):
        return  # a closed-loop run: its own gate (gate/episodes.py)
    given = [name for name in (*_GATE_OPTS, *_EXPECT_OPTS) if config.getoption(name, None)]
    if not given:
        return
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise pytest.UsageError(
            f"{flags} need an evaluation: give --ckpt NAME (without it no run is written and "
            "no gate could pass)"
        )
    if config.getoption("memeval_min_success", None):
        raise pytest.UsageError(
            f"{MIN_SUCCESS} is for closed-loop runs (a profile with an env); gate a scenario "
            "run with --memeval-min-m1 / --memeval-min-m2"
        )
    wi = workerinput(config)
    expect = config.getoption("memeval_expect")
    if wi is not None:  # an xdist worker: the controller read the list and sent it
        if expect:
            names = list(wi.get("memeval_known_failures", []))
            source = str(wi.get("memeval_known_failures_source", expect))
            config.pluginmanager.register(ExpectMarker(names, source), "memeval-expect")
        return
    settings = _settings(config, state)
    if settings.active:
        scope = set(state.scope_ids)
        tags = {s.id: frozenset(s.tags) for s in state.benchmark.scenarios if s.id in scope}
        gate = MemevalGate(config, settings, tags)
        # Known before any model loads; the run adds its own figure when written.
        gate.outcome.warnings = gate.pre_run_warnings()
        config.pluginmanager.register(gate, "memeval-gate")
    if expect:
        path = Path(expect)
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
        try:
            names = load_known_failures(path, state.history)
        except ExpectError as exc:
            raise pytest.UsageError(f"--memeval-expect: {exc}") from None
        source = str(expect)
        config.pluginmanager.register(ExpectMarker(names, source), "memeval-expect")
        if config.pluginmanager.has_plugin("xdist"):
            config.pluginmanager.register(_ExpectToWorkers(names, source), "memeval-expect-xdist")
