"""The controller side of a closed-loop run: journal, run directory, metrics, summary.

Each episode record reaches the controller on its item's report (runtime/episodes/worker.py),
is checked (``core/episode_records.validate_episode_record``) and appended to the run's
``journal.jsonl`` at once; at the session's end ``predictions.jsonl`` and ``metrics.json`` are
written atomically, the numbers counted from the file as written (the recount). A run with
environment errors or episodes not run is *incomplete* and says which; ``--memeval-resume``
keeps the journal's scored episodes and runs only the others (errors included), provided the
journal is of the same checkpoint, decoding and environment (its fingerprints).

Where the files go is a scenario run's layout (core/runlayout.py): each run journals into a
new ``subsets/<UTC time>/`` directory and is promoted to the top of the run directory when it
is finished (:func:`finished_run`: every episode of the run has a record; a shard's without
an environment error); a subset (``-k``, ``--lf``, deselected seeds) or an interrupted run
stays in its ``subsets/<time>/``, and the finished run at the top is left alone. A resumed
run continues the newest unfinished run in place, or a copy of the finished run's journal.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pytest_memeval.compat.pytest import drop_report_record, report_record
from pytest_memeval.compat.xdist import scheduler_has_pending
from pytest_memeval.core.episode_records import (
    EPISODE_RECORD_KIND,
    EpisodeRecord,
    EpisodeRecordError,
    EpisodeRunMetrics,
    episode_id,
    finalize_episode_run,
    validate_episode_record,
)
from pytest_memeval.core.formatting import shown_list
from pytest_memeval.core.ids import IdMap
from pytest_memeval.core.profiles import profile_to_plain
from pytest_memeval.core.rundir import JOURNAL, JOURNAL_HEADER_KEY, METRICS, Journal
from pytest_memeval.core.runlayout import new_subset_dir, promote, resume_target
from pytest_memeval.core.sharding import shard_scope
from pytest_memeval.decode.fast import EPISODES_TOGETHER
from pytest_memeval.runtime.episodes.items import (
    EpisodeState,
    check_not_only_scenario_items,
    episode_items,
    item_seed,
)
from pytest_memeval.runtime.scheduler import SchedulerPlugin
from pytest_memeval.runtime.stall import StallWatch, stall_timeout_from

__all__ = [
    "CONTROLLER_NAME",
    "EpisodeController",
    "RunStage",
    "deselect_resumed",
    "finished_run",
    "run_stage",
    "summary_lines",
]

CONTROLLER_NAME = "memeval-episode-controller"


def deselect_resumed(config: pytest.Config, state: EpisodeState, items: list[pytest.Item]) -> None:
    """``--memeval-resume``: leave out the episodes the journal already holds (every process
    alike: the workers get the controller's list)."""
    if not state.resume_done:
        return
    done = {i for i in episode_items(items) if _item_id(state, i) in state.resume_done}
    if done:
        config.hook.pytest_deselected(items=[i for i in items if i in done])
        items[:] = [i for i in items if i not in done]


def _item_id(state: EpisodeState, item: pytest.Item) -> str | None:
    seed = item_seed(item)
    return episode_id(state.spec, seed) if seed is not None else None


class RunStage(NamedTuple):
    """Where a run journals and writes its files before any promotion."""

    #: a new ``subsets/<time>/``, or the unfinished run a resumed run continues
    path: Path
    #: a resumed finished run's journal, copied into ``path`` at the first record
    copy_journal: Path | None


def finished_run(metrics: EpisodeRunMetrics) -> bool:
    """Whether a run is promoted to the top of its run directory: every episode of the run
    has a record. Environment errors included (``--memeval-resume`` copies its journal and
    reruns them), except in a shard: such a shard is no result for ``memeval merge``, and a
    resubmitted Slurm task resumes the unfinished run it leaves in ``subsets/<time>/``."""
    scope = metrics.get("scope")
    sharded = scope is not None and scope["shard"] is not None
    return not metrics["missing"] and not (sharded and metrics["error_ids"])


def run_stage(run_dir: Path, resume: bool, started: float) -> RunStage:
    """The stage of a run of ``run_dir`` started at ``started`` (``resume``: continuing)."""
    target = resume_target(run_dir) if resume else None
    if target == run_dir:
        # The finished run at the top is never rewritten in place: its journal is copied.
        return RunStage(new_subset_dir(run_dir, started), run_dir / JOURNAL)
    return RunStage(target or new_subset_dir(run_dir, started), None)


class EpisodeController:
    """Collects the episode records of a run and writes its directory at the end."""

    def __init__(self, config: pytest.Config, state: EpisodeState) -> None:
        self.config = config
        self.state = state
        self.stage = run_stage(state.run_dir, bool(config.getoption("memeval_resume")), time.time())
        self.journal = Journal(self.stage.copy_journal or self.stage.path / JOURNAL)
        self.records: dict[str, EpisodeRecord] = {}
        self.metrics: EpisodeRunMetrics | None = None
        #: where the run's files are at the end: the top of the run directory, or its stage
        self.written: Path | None = None
        self.started = time.monotonic()
        self.received = 0
        if config.getoption("memeval_resume"):
            self._resume()
        scheduler: SchedulerPlugin | None = None
        if config.pluginmanager.has_plugin("xdist"):
            # Each worker is sent the episodes it steps together at once (xdist's `load`
            # would queue about two on it): the scenario runs' scheduler, one scope an episode.
            chunk = EPISODES_TOGETHER if state.decode_path == "fast" else 1
            scheduler = SchedulerPlugin(IdMap(state.ids()), chunk=chunk)
            config.pluginmanager.register(scheduler, "memeval-scheduler")
        # As in a scenario run: a worker that stops without dying (a stopped process, a
        # simulator call that never returns) ends the run as unfinished and resumable after
        # --memeval-stall-timeout, instead of a run that waits for ever.
        config.pluginmanager.register(
            StallWatch(
                stall_timeout_from(config),
                scheduler.in_flight if scheduler is not None else dict,
                self._journal_kept,
                lambda: bool(scheduler_has_pending(config)),
            ),
            "memeval-stall-watch",
        )

    def _journal_kept(self) -> str | None:
        """Where the episodes finished so far are (``None`` before the first)."""
        return str(self.journal.path) if self.received else None

    def _header(self) -> dict[str, Any]:
        return {JOURNAL_HEADER_KEY: 1, "kind": "episodes", "fingerprints": self.state.fingerprints}

    def _resume(self) -> None:
        header = self.journal.read_header()
        if header is None:
            return  # nothing to resume: a fresh run
        if header.get("fingerprints") != self.state.fingerprints:
            raise pytest.UsageError(
                f"--memeval-resume: {self.journal.path} is of another checkpoint, decoding or "
                "environment (fingerprints differ); run without --memeval-resume to start over"
            )
        try:
            for lineno, _offset, data in self.journal.recover_lines():
                record = validate_episode_record(data, f"{self.journal.path}:{lineno}")
                self.records[record["id"]] = record
        except (EpisodeRecordError, ValueError) as exc:
            raise pytest.UsageError(f"--memeval-resume: {exc}") from None
        self.state.resume_done = {i for i, r in self.records.items() if r["reason"] != "env_error"}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist, a worker's collection of scenario items only (no episode item,
        none provided for the paths given) stops the run before any item is sent, as
        ``provide_episode_items`` does without xdist."""
        check_not_only_scenario_items(self.state, ids)

    def pytest_configure_node(self, node: Any) -> None:
        """The controller's resolved state, as plain data, for each xdist worker."""
        wi = node.workerinput
        wi["memeval_profile"] = profile_to_plain(self.state.profile)
        wi["memeval_overrides"] = self.state.overrides
        wi["memeval_run_dir"] = str(self.state.run_dir)
        wi["memeval_provide_items"] = self.state.provide_items
        wi["memeval_resume_done"] = sorted(self.state.resume_done)
        wi["memeval_episode_state"] = {
            "fingerprints": self.state.fingerprints,
            "env": self.state.env,
            "shard": list(self.state.shard) if self.state.shard else None,
            "decode": self.state.decode_path,
        }

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = report_record(report)
        if not isinstance(data, dict) or data.get("kind") != EPISODE_RECORD_KIND:
            return
        record = validate_episode_record(data, f"the report of {report.nodeid}")
        if not self.journal.is_open:
            self._open_journal()
        self.journal.append(record)
        self.records[record["id"]] = record
        self.received += 1
        drop_report_record(report)

    def _open_journal(self) -> None:
        """At the first record (a run that runs nothing leaves no directory): the stage's
        journal, a copy of a resumed finished run's, or the unfinished run's continued (its
        old metrics removed first, so that a kill never leaves them beside new records)."""
        resuming = bool(self.config.getoption("memeval_resume"))
        stage = self.stage.path
        if self.stage.copy_journal is not None:
            stage.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.stage.copy_journal, stage / JOURNAL)
            self.journal = Journal(stage / JOURNAL)
        elif resuming:
            (stage / METRICS).unlink(missing_ok=True)
        self.journal.open(truncate=not resuming, header=self._header())

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.journal.close()
        if not self.received:
            return  # nothing ran: no run directory written (or rewritten)
        self.metrics = finalize_episode_run(
            self.stage.path,
            profile=self.state.profile.name,
            env=self.state.env,
            fingerprints=self.state.fingerprints,
            ids=self.state.run_ids(),
            records=self.records,
            wall_s=round(time.monotonic() - self.started, 3),
            shard=shard_scope(self.state.ids(), self.state.shard),
        )
        self.written = self.stage.path
        if finished_run(self.metrics):
            promote(self.stage.path, self.state.run_dir)
            self.written = self.state.run_dir

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.metrics is None:
            return
        terminalreporter.section("memeval closed loop")
        for line in summary_lines(self.metrics, str(self.written)):
            terminalreporter.write_line(line)
        if self.written != self.state.run_dir:
            terminalreporter.write_line(
                f"not finished: written under {self.written}; the finished run at the top of "
                f"{self.state.run_dir} is left as it was (--memeval-resume continues this one)"
            )


def summary_lines(metrics: EpisodeRunMetrics, run_dir: str) -> list[str]:
    """The run's numbers in a few lines (the terminal summary)."""
    numbers = metrics["episodes"]
    success = numbers["success"]
    low, high = success.get("ci95") or (None, None)
    env = metrics["env"]
    lines = [
        f"{env.get('backend')} {env.get('version', '')} {env.get('game')} "
        f"fold {env.get('fold')}: {numbers['episodes']} episode(s)",
        f"success {success['correct']}/{success['total']} "
        f"({_percent(success['rate'])}, 95% CI {_percent(low)}-{_percent(high)}), "
        f"mean score {_number(numbers['mean_score'])}, "
        f"steps {numbers['steps']['total']} (mean {_number(numbers['steps']['mean'])}), "
        f"invalid actions {_percent(numbers['invalid_actions']['rate'])}",
        "ended by: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in numbers["reasons"].items() if v),
    ]
    if metrics["error_ids"]:
        lines.append(
            f"INCOMPLETE: environment error in {len(metrics['error_ids'])} episode(s) "
            f"({shown_list(metrics['error_ids'])}); not counted against the model, rerun "
            "them with --memeval-resume"
        )
    if metrics["missing"]:
        lines.append(
            f"incomplete: {len(metrics['missing'])} episode(s) not run "
            f"({shown_list(metrics['missing'])})"
        )
    scope = metrics.get("scope")
    shard = scope["shard"] if scope is not None else None
    if shard:
        lines.append(
            f"shard {shard['spec']}: episodes {shard['first']} .. {shard['last']} of "
            f"{shard['benchmark_total']}; merge the shards with memeval merge"
        )
    lines.append(f"run directory: {run_dir} (wall {metrics['wall_s']} s)")
    return lines


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
