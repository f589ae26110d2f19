"""Controller side: gather scenario records from test reports, write and check the run.

Runs in the xdist controller (or the single process without xdist). Records arrive on
``pytest_runtest_logreport`` from whichever worker ran the scenario; each is appended to the
run's journal at once (so a crash loses at most the scenarios in flight) and only its offset
is kept. At session finish the run directory is written in benchmark order, recounted
independently, and only then is ``metrics.json`` written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .metrics import Tally, metrics_document
from .recount import compare_counts, recount_file
from .resume import ResumeError, ResumePoint, ResumeSelection, journal_header, resume_point
from .rundir import (
    JOURNAL,
    JOURNAL_PREVIOUS,
    METRICS,
    PREDICTIONS,
    Journal,
    atomic_write,
    sha256_file,
    write_json,
)
from .sharding import shard_scope
from .state import MemevalState

__all__ = ["MemevalController"]


class MemevalController:
    """Aggregates records across workers and owns the run directory."""

    def __init__(self, config: pytest.Config, state: MemevalState) -> None:
        self.config = config
        self.state = state
        self.run_dir = state.run_dir
        self.journal = Journal(self.run_dir / JOURNAL)
        self.offsets: dict[str, int] = {}
        self.selected: set[str] | None = None
        self.metrics: dict[str, Any] | None = None
        self.problems: list[str] = []
        #: (scenarios in its forward pass, most per pass) of each written batched record
        self._batches: list[tuple[int, int]] = []
        self.started = time.time()
        self.resumed: ResumePoint | None = None
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
        if config.pluginmanager.has_plugin("xdist"):
            from .scheduler import SchedulerPlugin

            config.pluginmanager.register(_XdistSelection(self), "memeval-xdist-selection")
            config.pluginmanager.register(
                SchedulerPlugin(set(state.scope_ids), state.decode_path),
                "memeval-scheduler",
            )

    # -- collection: which scenarios this run selected -------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from .worker import scenario_param

        if session.config.pluginmanager.has_plugin("dsession"):
            return  # xdist controller: workers collect, see _XdistSelection
        self.selected = {sid for item in session.items if (sid := scenario_param(item))}

    def note_collected(self, nodeids: list[str]) -> None:
        scope = set(self.state.scope_ids)
        found = set()
        for nodeid in nodeids:
            if nodeid.endswith("]") and "[" in nodeid:
                param = nodeid[nodeid.rindex("[") + 1 : -1]
                if param in scope:
                    found.add(param)
        self.selected = found if self.selected is None else self.selected | found

    # -- records -------------------------------------------------------------------------

    def _begin(self) -> None:
        """Open the journal when this run first has something to keep (not at start: a run
        that selects no eval item must leave the previous run's directory alone).

        A fresh run moves the previous journal to ``journal.prev.jsonl`` rather than
        truncating it (a forgotten ``--memeval-resume`` loses nothing) and removes the
        previous ``metrics.json``: until this run finishes, the directory has no metrics, so
        a hard kill can never leave an older result looking like this run's.
        """
        if self.journal.is_open:
            return
        (self.run_dir / METRICS).unlink(missing_ok=True)
        path = self.journal.path
        if self.resumed is None and path.is_file() and path.stat().st_size:
            path.replace(self.run_dir / JOURNAL_PREVIOUS)
        self.journal.open(truncate=self.resumed is None, header=journal_header(self.state))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "memeval_record", None)
        if not isinstance(record, dict) or record.get("id") in self.offsets:
            return
        sid = record["id"]
        if sid not in self.state.scenarios:
            self.problems.append(f"record for unknown scenario {sid!r} from {report.nodeid}")
            return
        self._begin()
        self.offsets[sid] = self.journal.append(record)
        self.config.hook.pytest_memeval_record(config=self.config, record=record)

    # -- finish --------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if session.config.getoption("collectonly") or session.config.getoption("setupplan", False):
            # Nothing was evaluated on purpose: the run directory is not this session's.
            self.journal.close()
            return
        wall = time.time() - self.started
        scope = self.state.scope_ids
        selected = set(self.selected) if self.selected is not None else set(scope)
        if self.resumed is not None:
            selected |= self.resumed.done  # deselected because the journal has them
        done = [sid for sid in scope if sid in self.offsets]
        missing_selected = [sid for sid in scope if sid in selected and sid not in self.offsets]
        not_selected = [sid for sid in scope if sid not in selected]
        if not done and not missing_selected:
            self.journal.close()
            return  # no eval item ran or was selected (e.g. -k picked only plugin tests)
        self._begin()
        self.journal.close()

        predictions = self.run_dir / PREDICTIONS
        tally = Tally()
        self._batches = []
        atomic_write(predictions, self._predictions_lines(done, tally))
        recounted = recount_file(predictions)
        counts = tally.counts()
        disagreements = compare_counts(counts, recounted)
        if disagreements:
            self.problems.append(
                "recount disagrees with the aggregate: " + "; ".join(disagreements)
            )
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            return
        # A shard is never "complete": its metrics cover a slice, not the benchmark (compare
        # and the gate refuse it); `memeval merge` makes the complete run from all shards.
        complete = not missing_selected and not not_selected and self.state.shard is None
        profile = self.state.profile
        metrics = metrics_document(
            tally,
            ckpt=profile.name,
            kind=profile.kind,
            complete=complete,
            scope={
                "benchmark_total": len(self.state.benchmark.scenarios),
                "in_scope": len(scope),
                "selected": len(scope) - len(not_selected),
                "evaluated": len(done),
                "subset": bool(not_selected),
                "shard": shard_scope(self.state.benchmark.ids, self.state.shard),
                "resumed": len(self.resumed.offsets) if self.resumed is not None else 0,
            },
            missing=missing_selected,
            not_selected=not_selected,
            fingerprints=self.state.fingerprints,
            decoding={
                **(profile.generation.as_dict() if profile.kind == "model" else {}),
                "path": self.state.decode_path,
            },
            benchmark={"source": self.state.benchmark.source},
            predictions_sha256=sha256_file(predictions),
            timing={
                "wall_s": round(wall, 3),
                "scenarios_per_s": round(len(done) / wall, 3) if wall > 0 else None,
                **_batch_timing(self._batches),
            },
        )
        write_json(self.run_dir / METRICS, metrics)
        self.metrics = metrics
        self.config.hook.pytest_memeval_run_written(
            config=self.config, run_dir=self.run_dir, metrics=metrics
        )
        if missing_selected and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif (
            not missing_selected
            and self.resumed is not None
            and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        ):
            # Resuming a journal that already had everything: nothing to run is success.
            session.exitstatus = pytest.ExitCode.OK

    def _predictions_lines(self, ids: list[str], tally: Tally) -> Iterator[str]:
        import json

        for record in self.journal.read_at(self.offsets[sid] for sid in ids):
            tally.add(record)
            if isinstance(record.get("decode_batch"), int):
                self._batches.append((record["decode_batch"], record["decode_batch_size"]))
            yield json.dumps(record, ensure_ascii=False) + "\n"

    # -- terminal ------------------------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if not self.metrics and not self.problems:
            return
        tr.section("memeval")
        for problem in self.problems:
            tr.line(f"ERROR: {problem}", red=True, bold=True)
        m = self.metrics
        if not m:
            return
        tr.line(format_summary(m))
        if m["missing"]:
            shown = ", ".join(m["missing"][:10]) + (" ..." if len(m["missing"]) > 10 else "")
            tr.line(
                f"INCOMPLETE: {len(m['missing'])} selected scenario(s) have no result: {shown}",
                red=True,
                bold=True,
            )
            tr.line(
                f"the {m['scope']['evaluated']} finished scenario(s) are kept in "
                f"{self.run_dir / JOURNAL}; rerun with --memeval-resume to evaluate only "
                "the missing ones",
                red=True,
            )
        if self.resumed is not None:
            tr.line(
                f"resumed: {len(self.resumed.offsets)} scenario(s) taken from the journal, "
                f"{m['scope']['evaluated'] - len(self.resumed.offsets)} evaluated now"
            )
        if m["scope"]["subset"]:
            s = m["scope"]
            tr.line(
                f"subset run: {s['evaluated']} of {s['in_scope']} scenarios selected "
                "(metrics say complete: false)",
                yellow=True,
            )
        tr.line(f"run directory: {self.run_dir}")


def _pct(block: dict[str, Any]) -> str:
    rate = block["rate"]
    return f"{block['correct']}/{block['total']} = {rate * 100:.2f}%" if rate is not None else "n/a"


def _status(m: dict[str, Any]) -> str:
    shard = (m.get("scope") or {}).get("shard")
    if m["complete"]:
        return "complete"
    if shard and not m["missing"] and not m["not_selected"]:
        return f"shard {shard['spec']} complete; merge all shards with memeval merge"
    return "INCOMPLETE"


def _batch_timing(batches: list[tuple[int, int]]) -> dict[str, Any]:
    """``mean_batch`` (scenarios per forward pass, averaged over scenarios) and ``batch_size``
    (the most per pass) of the scenarios decoded by a batched pass; empty when none was."""
    if not batches:
        return {}
    return {
        "mean_batch": round(sum(b for b, _ in batches) / len(batches), 3),
        "batch_size": max(size for _, size in batches),
    }


def format_summary(m: dict[str, Any]) -> str:
    """The terminal lines for a metrics dict."""
    lines = [
        f"ckpt {m['ckpt']}: {m['n']} scenarios ({_status(m)})",
        f"m1 final-query: {_pct(m['m1'])}",
        f"m2 turn-level:  {_pct(m['m2'])}  (aligned scenarios only)",
        f"unaligned: {m['unaligned']}/{m['n']}   parse failures: final {m['parse_fail']['final']}, "
        f"turns {m['parse_fail']['turns']}",
    ]
    timing = m.get("timing") or {}
    if timing.get("scenarios_per_s") is not None:
        batch = (
            f", mean batch {timing['mean_batch']:.1f} of {timing['batch_size']}"
            if timing.get("mean_batch") is not None
            else ""
        )
        lines.append(
            f"throughput: {timing['scenarios_per_s']:.2f} scenarios/s "
            f"over {timing['wall_s']:.1f} s (decode {m['decoding'].get('path')}{batch})"
        )
    return "\n".join(lines)


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
        # Each worker deselects the same scenarios the controller resumed.
        resumed = self.controller.resumed
        if resumed is not None and resumed.offsets:
            node.workerinput["memeval_resume_done"] = sorted(resumed.offsets)


class _ReleaseRecords:
    """Drops ``memeval_record`` from each report once every plugin has seen it.

    pytest's terminal reporter keeps every report until the session ends; with the record on
    it, the controller would hold every scenario's record (prompts, outputs) in memory. The
    record is in the journal by then, and that is where the end of the run reads it from.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "memeval_record"):
            del report.memeval_record
