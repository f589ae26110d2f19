"""Controller side: gather scenario records from test reports, write and check the run.

Runs in the xdist controller (or the single process without xdist). Records arrive on
``pytest_runtest_logreport`` from whichever worker ran the scenario; each is appended to the
run's journal at once (so a crash loses at most the scenarios in flight) and only its offset
is kept. At session finish the run directory is written in benchmark order, recounted
independently, and only then is ``metrics.json`` written (core/results.py's ``finalize_run``,
which ``memeval merge`` uses too).

Where the files go (runlayout.py): each run journals into its own ``subsets/<time>/``
directory and is promoted to the top of the run directory only if it finished, so a subset or
interrupted run never replaces a finished one. The run directory is locked (runlock.py) from
the moment the session is known to evaluate something (collection selected an eval item;
``--memeval-resume`` at configure, since it reads the journal) to the session's end, so a
plain ``pytest tests/unit`` with ``--ckpt`` in ``addopts`` never collides with a running eval.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest

from pytest_memeval.compat.pytest import drop_report_record, line_in_progress, report_record
from pytest_memeval.compat.xdist import is_xdist_controller, scheduler_has_pending
from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.history import (
    HISTORY_MODEL,
    history_of,
)
from pytest_memeval.core.profiles import describe_overrides, profile_to_plain
from pytest_memeval.core.records import Metrics, Record
from pytest_memeval.core.results import FinalizeError, RunFacts, finalize_run
from pytest_memeval.core.rundir import JOURNAL, METRICS, Journal
from pytest_memeval.core.runlayout import (
    describe_stranded,
    new_subset_dir,
    resume_target,
    stranded,
    top_level_run,
)
from pytest_memeval.core.runlock import LockHeld, RunLock, describe_holder
from pytest_memeval.core.sharding import shard_scope
from pytest_memeval.core.slices import slice_table
from pytest_memeval.runtime.calibration import (
    CalibrationTally,
    calibration_report,
)
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.progress import Progress, ProgressReporter, interval_from
from pytest_memeval.runtime.resume import (
    ResumeError,
    ResumePoint,
    ResumeSelection,
    journal_header,
    resume_point,
)
from pytest_memeval.runtime.scheduler import SchedulerPlugin
from pytest_memeval.runtime.stall import StallWatch, stall_timeout_from
from pytest_memeval.runtime.startup import evaluates_nothing
from pytest_memeval.runtime.state import MemevalState
from pytest_memeval.runtime.summary import format_summary, free_running_lines

__all__ = ["MemevalController", "run_dir_line"]


def run_dir_line(run_dir: Path) -> str:
    """Where the run goes: said once collection has selected eval items (plugin.py without
    xdist, :meth:`MemevalController.note_collected` with it), never by a session that
    evaluates nothing."""
    return f"memeval: run directory {run_dir}"


class _Coverage(NamedTuple):
    """The scenarios in scope at the session's end, in benchmark order: evaluated (their
    records in the journal), selected but not evaluated, and not selected."""

    done: list[str]
    missing: list[str]
    not_selected: list[str]


class MemevalController:
    """Aggregates records across workers and owns the run directory."""

    def __init__(self, config: pytest.Config, state: MemevalState) -> None:
        self.config = config
        self.state = state
        self.run_dir = state.run_dir
        self.offsets: dict[str, int] = {}
        self.selected: set[str] | None = None
        #: whether the run directory was named (under xdist, at the first worker's collection)
        self.announced = False
        self.metrics: Metrics | None = None
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.started = time.time()
        self.resumed: ResumePoint | None = None
        #: where this run journals (a new subsets/<time>/, or the unfinished run it resumes)
        target = resume_target(self.run_dir) if config.getoption("memeval_resume") else None
        #: a finished top-level run being resumed: never rewritten in place (a failure would
        #: leave it without metrics); its journal is copied into a new subsets/<time>/ when
        #: this run has something to add (_begin), and nothing is written otherwise.
        self.copy_journal: Path | None = None
        if target == self.run_dir and top_level_run(self.run_dir) is not None:
            self.copy_journal, target = self.run_dir / JOURNAL, None
        self.stage = target or new_subset_dir(self.run_dir, self.started)
        #: hidden directories a crashed promotion left (reported, never touched)
        self.stranded = stranded(self.run_dir)
        #: where the finished files ended up, and the finished run a promotion kept
        self.written: Path | None = None
        self.kept_previous: Path | None = None
        self.lock: RunLock | None = None
        if config.getoption("memeval_resume", False):
            # Before reading the journal: another session may be appending to it.
            self.lock = _take_lock(config, self.run_dir, self.stage)
        self.journal = Journal(self.copy_journal or self.stage / JOURNAL)
        self.progress = Progress(interval_from(config))
        self.progress_reporter = ProgressReporter(self.progress, self._progress_total, config)
        config.pluginmanager.register(self.progress_reporter, "memeval-progress")
        if config.getoption("memeval_resume", False):
            try:
                self.resumed = resume_point(self.journal, state)
            except ResumeError as exc:
                raise pytest.UsageError(str(exc)) from None
            self.offsets.update(self.resumed.offsets)
            config.pluginmanager.register(
                ResumeSelection(self.resumed.done), "memeval-resume-selection"
            )
        config.pluginmanager.register(_ReleaseRecords(), "memeval-release-records")
        #: how each process got the fast path's calibration (measured, reused)
        self.calibrations = CalibrationTally()
        scheduler: SchedulerPlugin | None = None
        if config.pluginmanager.has_plugin("xdist"):
            config.pluginmanager.register(self.calibrations, "memeval-calibrations")
            config.pluginmanager.register(_XdistSelection(self), "memeval-xdist-selection")
            scheduler = SchedulerPlugin(state.benchmark.id_map, state.decode_path)
            config.pluginmanager.register(scheduler, "memeval-scheduler")
        # A worker that stops without dying (stopped, stuck in a device call) ends the run
        # as unfinished after --memeval-stall-timeout, instead of a run that never ends.
        config.pluginmanager.register(
            StallWatch(
                stall_timeout_from(config),
                scheduler.in_flight if scheduler is not None else dict,
                lambda: state.journal,
                lambda: bool(scheduler_has_pending(config)),
            ),
            "memeval-stall-watch",
        )

    # -- collection: which scenarios this run selected -------------------------------------

    # tryfirst, and registered after EarlyLoad: the lock is taken (or refused) before this
    # process loads the model for the items it selected.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if is_xdist_controller(session.config):
            return  # xdist controller: workers collect, see _XdistSelection
        self.selected = {sid for item in session.items if (sid := scenario_param(item))}
        if self.selected:
            self._lock_run_dir()

    def note_collected(self, nodeids: list[str]) -> None:
        scope = set(self.state.scope_ids)
        id_map = self.state.benchmark.id_map  # node ids hold pytest ids, not scenario ids
        found = {sid for nodeid in nodeids if (sid := id_map.scenario_of(nodeid)) in scope}
        self.selected = found if self.selected is None else self.selected | found
        if found:
            # Before xdist schedules any item: every worker reports its collection first.
            self._lock_run_dir()
            if not self.announced:
                self.announced = True
                self._say(run_dir_line(self.run_dir))

    def _say(self, line: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        # xdist's status line leaves the cursor mid-line: start a line of our own.
        if line_in_progress(tr):  # compat.pytest
            tr.write("\n")
        tr.write_line(line)

    def _lock_run_dir(self) -> None:
        if self.lock is None:
            self.lock = _take_lock(self.config, self.run_dir, self.stage)

    # -- records -------------------------------------------------------------------------

    def _begin(self) -> None:
        """Open the journal when this run first has something to keep (not at start: a run
        that selects no eval item must leave the run directory alone).

        A fresh run journals into a new ``subsets/<time>/`` directory, so no earlier run's
        file is touched. A resumed run appends to the journal it continues and removes that
        run's old ``metrics.json`` first: until this run finishes, its directory has no
        metrics, so a hard kill never leaves the older result looking like this run's.
        """
        if self.journal.is_open:
            return
        if self.copy_journal is not None:
            # Byte for byte, so the offsets read from the finished run's journal stay valid.
            self.stage.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.copy_journal, self.stage / JOURNAL)
            self.journal = Journal(self.stage / JOURNAL)
        if self.resumed is not None:
            (self.stage / METRICS).unlink(missing_ok=True)
        self.journal.open(truncate=self.resumed is None, header=journal_header(self.state))
        # Where the records are, for a run stopped later by a failing replacement worker
        # (startup.StartupWatch): its message must not say that nothing was written.
        self.state.journal = str(self.journal.path)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = report_record(report)
        if not isinstance(record, dict) or record.get("id") in self.offsets:
            return
        sid = record["id"]
        if sid not in self.state.scenarios:
            self.problems.append(f"record for unknown scenario {sid!r} from {report.nodeid}")
            return
        self._begin()
        self.offsets[sid] = self.journal.append(record)
        self.progress_reporter.note()
        self.config.hook.pytest_memeval_record(config=self.config, record=record)

    def _progress_total(self) -> int | None:
        """Scenarios this session evaluates (resumed ones excluded), once collection says."""
        return len(self.selected) if self.selected is not None else None

    # -- finish --------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._writes_nothing(session.config):
            self.journal.close()
            return
        wall = time.time() - self.started
        covered = self._coverage()
        if not covered.done and not covered.missing:
            self.journal.close()
            return  # no eval item ran or was selected (e.g. -k picked only plugin tests)
        if self.copy_journal is not None and not self.journal.is_open and not covered.missing:
            self._nothing_to_resume(session)
            return
        self._begin()
        self.journal.close()
        local = self.config.pluginmanager.get_plugin("memeval-worker")
        if local is not None:  # this process decoded (no xdist): its own calibration
            self.calibrations.add(calibration_report(local.loaded_decoder))
        facts = self._run_facts(covered, wall)
        try:
            # The journal holds the records this controller appended from the workers'
            # reports: scoring.score's Records (plain data across processes); the written
            # predictions are recounted by finalize_run.
            records = cast(
                "Iterator[Record]", self.journal.read_at(self.offsets[sid] for sid in covered.done)
            )
            result = finalize_run(
                records,
                facts,
                stage=self.stage,
                run_dir=self.run_dir,
            )
        except FinalizeError as exc:
            self.problems.append(str(exc))
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            return
        metrics = self.metrics = result.metrics
        self.written, self.kept_previous = result.written, result.kept_previous
        self.config.hook.pytest_memeval_run_written(
            config=self.config, run_dir=self.written, metrics=metrics
        )
        self._finish_exit_status(session, covered)

    def _writes_nothing(self, config: pytest.Config) -> bool:
        """Whether this session may write nothing to the run directory at all."""
        if evaluates_nothing(config):
            # Nothing was evaluated on purpose: the run directory is not this session's.
            return True
        if self.state.startup_failure:
            # A worker (or this process) could not start or load the model: the run directory
            # keeps whatever it held (startup.py); records of scenarios evaluated before a
            # replacement worker failed stay in this run's journal (the message says where).
            return True
        # No eval item was selected, or the lock was refused (another run holds the run
        # directory): either way, nothing of this session may be written there.
        return self.lock is None

    def _coverage(self) -> _Coverage:
        """Which scenarios in scope were evaluated, selected but not evaluated, not selected."""
        scope = self.state.scope_ids
        selected = set(self.selected) if self.selected is not None else set(scope)
        if self.resumed is not None:
            selected |= self.resumed.done  # deselected because the journal has them
        return _Coverage(
            done=[sid for sid in scope if sid in self.offsets],
            missing=[sid for sid in scope if sid in selected and sid not in self.offsets],
            not_selected=[sid for sid in scope if sid not in selected],
        )

    def _nothing_to_resume(self, session: pytest.Session) -> None:
        """--memeval-resume of the finished top-level run, nothing new to evaluate: it stays
        as it is."""
        taken = len(self.resumed.offsets) if self.resumed is not None else 0
        self.notes += [
            f"resumed: {taken} scenario(s) taken from the journal, 0 evaluated now",
            f"nothing to resume: {self.run_dir} holds the finished run with every "
            "selected scenario; it was left as it is",
        ]
        if session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK

    def _run_facts(self, covered: _Coverage, wall: float) -> RunFacts:
        """What the run's metrics say about it besides the records."""
        profile, scope = self.state.profile, self.state.scope_ids
        return RunFacts(
            ckpt=profile.name,
            kind=profile.kind,
            # A shard is never "complete": its metrics cover a slice, not the benchmark
            # (compare and the gate refuse it); `memeval merge` makes the complete run.
            complete=not covered.missing and not covered.not_selected and self.state.shard is None,
            scope={
                "benchmark_total": len(self.state.benchmark.scenarios),
                "in_scope": len(scope),
                "selected": len(scope) - len(covered.not_selected),
                "evaluated": len(covered.done),
                "subset": bool(covered.not_selected),
                "shard": shard_scope(self.state.benchmark.ids, self.state.shard),
                "resumed": len(self.resumed.offsets) if self.resumed is not None else 0,
            },
            missing=covered.missing,
            not_selected=covered.not_selected,
            fingerprints=self.state.fingerprints,
            decoding={
                **(profile.generation.as_dict() if profile.kind == "model" else {}),
                "path": self.state.decode_path,
            },
            benchmark={"source": self.state.benchmark.source},
            wall_s=round(wall, 3),
            timing=self.calibrations.timing(),
            # --memeval-model/--memeval-adapter/--memeval-set: what differs from the profile.
            overrides=self.state.overrides,
            history=self.state.history,
        )

    def _finish_exit_status(self, session: pytest.Session, covered: _Coverage) -> None:
        """A selected scenario left unevaluated fails the session; resuming a journal that
        already had everything succeeds (nothing to run is success)."""
        if covered.missing and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif (
            not covered.missing
            and self.resumed is not None
            and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        ):
            session.exitstatus = pytest.ExitCode.OK

    # -- terminal ------------------------------------------------------------------------

    def pytest_report_header(self) -> list[str]:
        lines = []
        stale = self.lock.took_over if self.lock is not None else None
        if stale:
            lines.append(_stale_note(stale))
        if (
            self.resumed is not None
            and not self.resumed.fresh
            and self.copy_journal is None
            and self.stage != self.run_dir
        ):
            lines.append(f"memeval: resuming the unfinished run in {self.stage}")
        lines.extend(describe_stranded(path) for path in self.stranded)
        return lines

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        stale = self.lock.took_over if self.lock is not None else None
        if not (self.metrics or self.problems or stale or self.notes or self.stranded):
            return
        tr.section("memeval")
        if stale:
            tr.line(_stale_note(stale), yellow=True)
        for path in self.stranded:
            tr.line(describe_stranded(path), yellow=True)
        for problem in self.problems:
            tr.line(f"ERROR: {problem}", red=True, bold=True)
        for note in self.notes:
            tr.line(note)
        m = self.metrics
        if not m:
            return
        tr.line(format_summary(m))
        if history_of(m) == HISTORY_MODEL:
            for line in free_running_lines(self.run_dir, m):
                tr.line(line)
        if _show_slices(self.config):
            for line in slice_table(m.get("slices") or {}) or [
                "slices: none (no scenario of the benchmark has tags)"
            ]:
                tr.line(line)
        left = len(m["missing"]) + len(m["not_selected"])
        total = self.progress.done + len(m["missing"])
        wall_s = m["timing"]["wall_s"]
        assert isinstance(wall_s, float)  # this session's finalize_run wrote it
        tr.line(self.progress.summary(total, left, wall_s))
        if m.get("overrides"):
            # This session's own overrides table (core/profiles.py: key -> value, profile).
            overrides = cast("dict[str, dict[str, str | None]]", m["overrides"])
            tr.line(f"overridden on the command line: {describe_overrides(overrides)}")
        if m["missing"]:
            shown = shown_ids(m["missing"])
            tr.line(
                f"INCOMPLETE: {len(m['missing'])} selected scenario(s) have no result: {shown}",
                red=True,
                bold=True,
            )
            tr.line(
                f"the {m['scope']['evaluated']} finished scenario(s) are kept in "
                f"{self.stage / JOURNAL}; rerun with --memeval-resume to evaluate only "
                "the missing ones",
                red=True,
            )
        if self.resumed is not None:
            evaluated = m["scope"]["evaluated"]
            assert isinstance(evaluated, int)  # this session's scope (RunFacts above)
            tr.line(
                f"resumed: {len(self.resumed.offsets)} scenario(s) taken from the journal, "
                f"{evaluated - len(self.resumed.offsets)} evaluated now"
            )
        if m["scope"]["subset"]:
            s = m["scope"]
            tr.line(
                f"subset run: {s['evaluated']} of {s['in_scope']} scenarios selected "
                "(metrics say complete: false)",
                yellow=True,
            )
        for line in self._placement_lines():
            tr.line(line, yellow=self.written != self.run_dir)

    def _placement_lines(self) -> list[str]:
        """Where this run's files are, and what the top of the run directory holds."""
        if self.written is None:
            return []
        if self.written == self.run_dir:
            lines = [f"run directory: {self.run_dir}"]
            if self.kept_previous is not None:
                lines.append(f"the finished run it replaced is kept in {self.kept_previous}")
            return lines
        top = top_level_run(self.run_dir)
        held = (
            f"{self.run_dir} keeps the finished run of {top.get('created', '?')} "
            "(compare, the gate and report read that one)"
            if top is not None
            else f"{self.run_dir} holds no finished run yet"
        )
        return [
            f"run directory: {self.written} (not finished: written beside the finished run)",
            held,
        ]


def _show_slices(config: pytest.Config) -> bool:
    """``--memeval-slices``, else the ``memeval_slices`` ini value."""
    shown = config.getoption("memeval_slices", None)
    return bool(config.getini("memeval_slices") if shown is None else shown)


def _take_lock(config: pytest.Config, run_dir: Path, stage: Path) -> RunLock | None:
    """Lock ``run_dir`` for this session (released at unconfigure, also after a failure or an
    interrupt), or refuse with a usage error naming the run that holds it.

    ``--collect-only``, ``--setup-plan``, ``--help``, ``--fixtures``, ``--fixtures-per-test``,
    ``--markers`` and ``--version`` evaluate nothing and take nothing.
    """
    if evaluates_nothing(config):
        return None
    try:
        lock = RunLock.acquire(run_dir, writes=stage)
    except LockHeld as exc:
        raise pytest.UsageError(str(exc)) from None
    except OSError as exc:
        raise pytest.UsageError(
            f"pytest-memeval: cannot lock the run directory {run_dir} "
            f"({exc.strerror or exc}); is it writable? (--memeval-out chooses another)"
        ) from None
    config.add_cleanup(lock.release)
    return lock


def _stale_note(stale: dict[str, Any]) -> str:
    where = stale.get("writes")
    unfinished = (
        f"; its unfinished run is in {where} (continue it with --memeval-resume)"
        if where and (Path(where) / JOURNAL).is_file()
        else ""
    )
    return (
        f"memeval: took over a stale lock of {describe_holder(stale)}, which is no longer "
        f"running{unfinished}"
    )


class _XdistSelection:
    """Registered only with xdist: the controller does not collect, its workers report ids;
    and it hands each worker the plain data it checks against (benchmark, resumed ids)."""

    def __init__(self, controller: MemevalController) -> None:
        self.controller = controller

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.controller.note_collected(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # Plain data only. Each worker rebuilds the benchmark itself and checks it got the
        # same scenarios (a non-deterministic builder would otherwise split silently).
        node.workerinput["memeval_benchmark_fingerprint"] = (
            self.controller.state.benchmark.fingerprint
        )
        # The whole resolved profile (overrides applied) and the run settings: a worker must
        # not re-derive them (its own rootdir/ini search can differ, see cmdline.py).
        state = self.controller.state
        wi = node.workerinput
        wi["memeval_profile"] = profile_to_plain(state.profile)
        wi["memeval_overrides"] = state.overrides
        wi["memeval_run_dir"] = str(state.run_dir)
        wi["memeval_decode_path"] = state.decode_path
        wi["memeval_history"] = state.history
        # The calibration store's settings: one cache directory and run id for every worker,
        # so a worker reuses (waits for) the calibration another worker measures.
        wi["memeval_fingerprints"] = dict(state.fingerprints)
        wi["memeval_cache_dir"] = str(state.cache_dir) if state.cache_dir else ""
        wi["memeval_run_id"] = state.run_id
        wi["memeval_recalibrate"] = state.recalibrate
        wi["memeval_provide_items"] = state.provide_items
        spec = getattr(getattr(node, "gateway", None), "spec", None)
        if spec is not None and getattr(spec, "popen", False) and not getattr(spec, "chdir", None):
            # Same machine, same working directory: the worker must end up with our setup.
            config = self.controller.config
            wi["memeval_rootdir"] = str(config.rootpath)
            wi["memeval_inifile"] = str(config.inipath) if config.inipath else None
        # Each worker deselects the same scenarios the controller resumed.
        resumed = self.controller.resumed
        if resumed is not None and resumed.offsets:
            node.workerinput["memeval_resume_done"] = sorted(resumed.offsets)


class _ReleaseRecords:
    """Drops the scenario record from each report once every plugin has seen it.

    pytest's terminal reporter keeps every report until the session ends; with the record on
    it, the controller would hold every scenario's record (prompts, outputs) in memory. The
    record is in the journal by then, and that is where the end of the run reads it from.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        drop_report_record(report)
