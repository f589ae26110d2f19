"""Worker side: decode scenarios, cache their records, attach them to test reports.

Runs in every xdist worker, or in the single process without xdist. The record of a scenario
is computed once, by whichever of its items runs first, and rides on each of its items' call
reports (plain JSON data, serialised by xdist with the report; ``compat.pytest``'s
``set_report_record``).
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import pytest

from pytest_memeval.compat import installed_version
from pytest_memeval.compat.pytest import drop_report_record, set_report_record
from pytest_memeval.compat.xdist import pending_item_indices
from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.formatting import shown_list
from pytest_memeval.core.history import history_words
from pytest_memeval.core.records import Record
from pytest_memeval.core.scoring import score
from pytest_memeval.runtime.calibration import OUTPUT_KEY, calibration_report
from pytest_memeval.runtime.devices import (
    CPU,
    REPLAY_DEVICE_LABEL,
    device_label,
    is_out_of_memory,
    worker_device,
)
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.state import MemevalState, is_worker, worker_id

if TYPE_CHECKING:
    from collections.abc import Generator

    from pytest_memeval.decode import Decoder

__all__ = [
    "PREFETCH_SIZE",
    "RECORD_CACHE_SIZE",
    "HistoryMismatch",
    "MemevalWorker",
    "PrefetchError",
    "PrefetchWarning",
]

RECORD_KEY = pytest.StashKey[Record]()

#: Most scenario records one process keeps at a time (see MemevalWorker._records).
RECORD_CACHE_SIZE = 64

#: Most scenarios handed to ``Decoder.prefetch`` at once (see MemevalWorker._prefetch).
PREFETCH_SIZE = 16


class PrefetchWarning(UserWarning):
    """Batched prefetch is off in this process (a batch ran out of memory, or xdist's queue
    of this worker's next items cannot be read); it decodes one scenario at a time."""


class HistoryMismatch(RuntimeError):
    """A decoder returned a rollout of another history than the run's (a decoder from a
    ``pytest_memeval_make_decoder`` hook that ignores ``history``)."""


class PrefetchError(RuntimeError):
    """A decoder's prefetch failed with something other than running out of memory (a bug);
    the original exception is its ``__cause__``."""


class MemevalWorker:
    """Per-process evaluation state: the lazily built decoder and the records computed here."""

    def __init__(self, config: pytest.Config, state: MemevalState) -> None:
        self.config = config
        self.state = state
        self._decoder: Decoder | None = None
        # Bounded: a scenario's record is dropped once all its items here have run (items
        # are grouped per scenario), and at most RECORD_CACHE_SIZE are kept whatever the order.
        self._records: OrderedDict[str, Record] = OrderedDict()
        self._pending: dict[str, int] = {}
        self.device = "unassigned"
        self.device_label = "unassigned"  # what records note, e.g. "cuda:0 (physical 5)"
        self._items: list[pytest.Item] = []
        self._run_order: list[str] | None = None  # scenario ids in run order (no xdist)
        self._run_rank: dict[str, int] = {}
        self._decode_share: dict[str, float] = {}  # prefetch seconds per prefetched scenario
        self._prefetch_off = False  # set by a failed prefetch (see _prefetch)

    def load_decoder(self) -> Decoder:
        """Build this process's decoder now (loads the model); errors propagate as they are.

        Called before any item runs (startup.EarlyLoad), which turns a failure into one
        message that stops the run.
        """
        if self._decoder is None:
            if self.state.profile.kind == "replay":
                # A replay decodes nothing: no device to pick, and no torch to import (about
                # 2 s per process, each xdist worker's included).
                self.device, self.device_label = CPU, REPLAY_DEVICE_LABEL
            else:
                self.device = worker_device(self.config)
                self.device_label = device_label(self.config, self.device)
            self._decoder = self.config.hook.pytest_memeval_make_decoder(
                config=self.config,
                profile=self.state.profile,
                path=self.state.decode_path,
                device=self.device,
                history=self.state.history,
            )
        assert self._decoder is not None
        return self._decoder

    @property
    def loaded_decoder(self) -> Decoder | None:
        """The decoder if this process has built it (``None`` on an xdist controller)."""
        return self._decoder

    def decoder(self) -> Decoder:
        """The decoder, loaded already: startup.EarlyLoad loads it before any item runs (or
        stops the run), so a failure to load never reaches an item."""
        return self.load_decoder()

    def record_for(self, scenario: Scenario) -> Record:
        cached = self._records.get(scenario.id)
        if cached is not None:
            return cached
        decoder = self.decoder()
        self._prefetch(decoder, scenario)
        started = time.perf_counter()
        rollout = decoder.rollout(scenario)
        if rollout.history != self.state.history:
            raise HistoryMismatch(
                f"scenario {scenario.id!r}: the decoder ({type(decoder).__name__}, from "
                f"pytest_memeval_make_decoder) decoded it {history_words(rollout.history)} "
                f"(history {rollout.history}), but this run is {history_words(self.state.history)} "
                f"(--memeval-history {self.state.history}); a decoder of another history would "
                "pass one kind of result off as the other"
            )
        batched = (
            {"decode_batch": rollout.batch, "decode_batch_size": rollout.batch_size}
            if rollout.batch_size
            else {}
        )
        record = score(
            scenario,
            rollout,
            self.state.profile.parse,
            worker=worker_id(self.config),
            device=self.device_label,
            decode_s=round(
                time.perf_counter() - started + self._decode_share.pop(scenario.id, 0.0), 6
            ),
            **batched,
        )
        overlong = self.state.overlong.get(scenario.id)
        if overlong is not None:
            # Evaluated past the model's context on request (preflight.py): say so on the
            # record itself, so no reader of predictions.jsonl takes it for a normal result.
            record["overlong"] = {"tokens": overlong["tokens"], "limit": overlong["limit"]}
        self._records[scenario.id] = record
        while len(self._records) > RECORD_CACHE_SIZE:
            self._records.popitem(last=False)  # recomputed (deterministically) if needed again
        return record

    def _prefetch(self, decoder: Decoder, scenario: Scenario) -> None:
        """Let the decoder batch ``scenario`` with the scenarios this process runs next.

        Only scenarios that certainly run here: without xdist the session's own item order;
        under xdist the items the controller has already sent to this worker (with the
        fast path, the scenario scheduler sends a batch's worth of scenarios at once). The
        prefetch time is split evenly
        over the batch, so each record's ``decode_s`` still adds up to the decoding time.

        A prefetch that raises is never silent, and turns prefetch off in this process:

        * out of memory (:func:`~pytest_memeval.runtime.devices.is_out_of_memory`): the batch
          did not fit; a :class:`PrefetchWarning` (pytest's warnings summary, also under
          xdist) names the scenarios and the error, and each scenario is decoded on its own
          (same results, slower);
        * anything else is a bug in the decoder: :class:`PrefetchError`, naming the batch's
          scenarios and chaining the original exception, fails the item that asked; the
          others are decoded on their own.
        """
        if self._prefetch_off or scenario.id in self._decode_share:
            return
        upcoming = [scenario.id]
        for sid in self._upcoming(scenario.id):
            if len(upcoming) >= PREFETCH_SIZE:
                break
            if sid not in upcoming and sid in self._pending and sid not in self._records:
                upcoming.append(sid)
        if len(upcoming) < 2:
            return
        by_id = self.state.scenarios
        started = time.perf_counter()
        try:
            decoder.prefetch([by_id[sid] for sid in upcoming])
        except Exception as exc:
            # Never silent: a swallowed failure here looks like mere slowness. Prefetch is
            # turned off in this process either way, so one failure costs one batch, not a
            # failure per batch, and the rest is decoded one scenario at a time.
            self._prefetch_off = True
            what = f"{type(exc).__name__}: {_first_line(exc)}"
            ids = shown_list(repr(sid) for sid in upcoming)
            if not is_out_of_memory(exc):
                # Anything else is a bug in the decoder: the item asking errors with it (and
                # its traceback, chained below); the other scenarios are decoded alone.
                raise PrefetchError(
                    f"the decoder's prefetch of {len(upcoming)} scenarios ({ids}) failed on "
                    f"{self._where()} with {what}; prefetch is off for the rest of this "
                    "process (the other scenarios are decoded one at a time)"
                ) from exc
            # The batch did not fit on this device: the results are the same decoded one by
            # one, only slower; say so once. (The message is built now and the exception
            # dropped with this block: its traceback holds the batch's tensors.)
            warnings.warn(
                PrefetchWarning(
                    f"batched prefetch of {len(upcoming)} scenarios ({ids}) ran out of memory "
                    f"on {self._where()} ({what}); decoding one scenario at a time from now on "
                    "in this process "
                    "(same results, slower). Lower the fast path's batch_size or "
                    "max_batch_tokens, or run fewer workers per GPU."
                ),
                stacklevel=1,
            )
            self._decode_share.update(dict.fromkeys(upcoming, 0.0))
            return
        share = (time.perf_counter() - started) / len(upcoming)
        self._decode_share.update(dict.fromkeys(upcoming, share))

    def _where(self) -> str:
        """``worker gw0 on cuda:0 (physical 5)``; without xdist just the device."""
        if is_worker(self.config):
            return f"worker {worker_id(self.config)} on {self.device_label}"
        return self.device_label

    def _upcoming(self, current: str) -> list[str]:
        """Scenario ids of the items this process will run after ``current``'s, in order."""
        if is_worker(self.config):
            indices = pending_item_indices(self.config)  # compat.xdist
            if indices is None:
                # This xdist's queue cannot be read: nothing is known to run here next.
                # Prefetch goes off for this process, said once (same results, slower).
                self._prefetch_off = True
                warnings.warn(
                    PrefetchWarning(
                        f"batched prefetch is off on {self._where()}: the queue of items "
                        f"pytest-xdist {installed_version('pytest-xdist')} has sent this "
                        "worker cannot be read (pytest_memeval.compat.xdist reads it on "
                        "pytest-xdist 3.8); each scenario is decoded on its own (same "
                        "results, slower)"
                    ),
                    stacklevel=1,
                )
                return []
            ids = (scenario_param(self._items[i]) for i in indices if 0 <= i < len(self._items))
            return [sid for sid in ids if sid is not None]
        if self._run_order is None:
            self._run_rank = {}
            for item in self._items:
                sid = scenario_param(item)
                if sid is not None:
                    self._run_rank.setdefault(sid, len(self._run_rank))
            self._run_order = list(self._run_rank)
        rank = self._run_rank.get(current)
        if rank is None:
            return []
        return self._run_order[rank + 1 : rank + 4 * PREFETCH_SIZE]

    def pytest_sessionfinish(self) -> None:
        """An xdist worker tells the controller how its decoder got its calibration
        (``runtime/calibration.py``; plain data in ``workeroutput``)."""
        output = getattr(self.config, "workeroutput", None)
        report = calibration_report(self._decoder)
        if isinstance(output, dict) and report is not None:
            output[OUTPUT_KEY] = report

    def attach(self, item: pytest.Item, record: Record) -> None:
        item.stash[RECORD_KEY] = record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and report.when == "call":
            set_report_record(report, record)
            # The session keeps every item to the end: do not let each one pin its record.
            del item.stash[RECORD_KEY]

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # On an xdist worker the report has been sent to the controller by now (xdist's own
        # logreport runs before trylast ones); pytest keeps every report to the end of the
        # session, so drop the record from it. (The controller does the same after
        # journaling, see controller._ReleaseRecords.)
        if is_worker(self.config):
            drop_report_record(report)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Count this process's items per scenario (after any deselection)."""
        self._pending.clear()
        self._items = session.items
        self._run_order = None
        for item in session.items:
            sid = scenario_param(item)
            if sid is not None:
                self._pending[sid] = self._pending.get(sid, 0) + 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, None]:
        yield
        sid = scenario_param(item)
        if sid is None:
            return
        left = self._pending.get(sid, 1) - 1
        if left > 0:
            self._pending[sid] = left
        else:
            # Every item of this scenario has run here: its record lives on in the journal.
            self._pending.pop(sid, None)
            self._records.pop(sid, None)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Keep each scenario's items adjacent, so its rollout is used while it is fresh and
        xdist's scheduler can hand the whole scenario to one worker."""
        order: dict[str, int] = {}
        first_eval: int | None = None
        keyed: list[tuple[int, int, pytest.Item]] = []
        for pos, item in enumerate(items):
            sid = scenario_param(item)
            if sid is None:
                keyed.append((pos, 0, item))
                continue
            if first_eval is None:
                first_eval = pos
            rank = order.setdefault(sid, len(order))
            # Eval items keep their block's position (the first eval item's), grouped by
            # scenario in first-seen order; other items keep theirs.
            keyed.append((first_eval, rank * 1_000_000 + pos, item))
        items[:] = [item for _, _, item in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "(no message)"
