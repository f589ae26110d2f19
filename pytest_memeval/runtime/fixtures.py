"""The fixtures eval items use: the scenario, the worker's decoder, the scenario's record."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.records import Record
from pytest_memeval.runtime.state import STATE_KEY

if TYPE_CHECKING:
    from pytest_memeval.decode import Decoder
    from pytest_memeval.runtime.worker import MemevalWorker


def _worker(config: pytest.Config) -> MemevalWorker:
    plugin = config.pluginmanager.get_plugin("memeval-worker")
    if plugin is None:
        pytest.skip("no --ckpt given: eval items need a checkpoint profile")
    return plugin  # type: ignore[no-any-return]


@pytest.fixture
def memeval_scenario(request: pytest.FixtureRequest) -> Scenario:
    """The scenario of this item (parametrized by the plugin over the profile's benchmark)."""
    scenario: Scenario = request.config.stash[STATE_KEY].scenarios[request.param]
    return scenario


@pytest.fixture(scope="session")
def memeval_decoder(request: pytest.FixtureRequest) -> Decoder:
    """This worker's decoder: the model is loaded once per worker, on first use."""
    return _worker(request.config).decoder()


@pytest.fixture
def memeval_record(request: pytest.FixtureRequest, memeval_scenario: Scenario) -> Record:
    """The scenario's scored record; its rollout is computed once per scenario per run."""
    worker = _worker(request.config)
    record = worker.record_for(memeval_scenario)
    worker.attach(request.node, record)
    return record
