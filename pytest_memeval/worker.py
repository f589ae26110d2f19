"""Worker side: decode scenarios, cache their records, attach them to test reports.

Runs in every xdist worker, or in the single process without xdist. The record of a scenario
is computed once, by whichever of its items runs first, and rides on each of its items' call
reports as ``report.memeval_record`` (plain JSON data, serialised by xdist with the report).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from .benchmark import Scenario
from .devices import worker_device
from .scoring import score
from .state import MemevalState, worker_id

if TYPE_CHECKING:
    from collections.abc import Generator

    from .decode import Decoder

RECORD_KEY = pytest.StashKey[dict[str, Any]]()


class MemevalWorker:
    """Per-process evaluation state: the lazily built decoder and the records computed here."""

    def __init__(self, config: pytest.Config, state: MemevalState) -> None:
        self.config = config
        self.state = state
        self._decoder: Decoder | None = None
        self._decoder_error: str | None = None
        self._records: dict[str, dict[str, Any]] = {}
        self.device = "unassigned"

    def decoder(self) -> Decoder:
        if self._decoder_error is not None:
            pytest.fail(self._decoder_error, pytrace=False)
        if self._decoder is None:
            from .model import CheckpointError

            self.device = worker_device(self.config)
            try:
                decoder = self.config.hook.pytest_memeval_make_decoder(
                    config=self.config,
                    profile=self.state.profile,
                    path=self.state.decode_path,
                    device=self.device,
                )
            except CheckpointError as exc:
                # Every item of this worker would fail the same way: say it once, plainly.
                self._decoder_error = f"cannot load checkpoint: {exc}"
                pytest.fail(self._decoder_error, pytrace=False)
            self._decoder = decoder
        return self._decoder

    def record_for(self, scenario: Scenario) -> dict[str, Any]:
        cached = self._records.get(scenario.id)
        if cached is not None:
            return cached
        decoder = self.decoder()
        started = time.perf_counter()
        rollout = decoder.rollout(scenario)
        record = score(
            scenario,
            rollout,
            self.state.profile.parse,
            worker=worker_id(self.config),
            device=self.device,
            decode_s=round(time.perf_counter() - started, 6),
        )
        self._records[scenario.id] = record
        return record

    def attach(self, item: pytest.Item, record: dict[str, Any]) -> None:
        item.stash[RECORD_KEY] = record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and report.when == "call":
            report.memeval_record = record

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


def scenario_param(item: pytest.Item) -> str | None:
    """The scenario id an eval item is parametrized with, or ``None`` for other items."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("memeval_scenario")
    return value if isinstance(value, str) else None
