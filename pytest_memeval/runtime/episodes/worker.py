"""The worker side of a closed-loop run: one model and one environment per process.

Each process that runs episode items (an xdist worker, or the single process) loads the
checkpoint once, at its first episode, as the policy (``decode/policy.ModelPolicy``: one
greedy ``generate`` over the whole conversation per action, the reference decoder), and holds
one :class:`~pytest_memeval.env.EpisodeRunner`: the environment is started at the first
episode, replaced after an environment error, and closed when the process's session ends (no
JVM is left behind). Each item's episode record rides on its report to the controller, as a
scenario's record does; an environment error is raised in the item's setup, so the item is
an *error*, never a failure of the model.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_memeval.compat.pytest import drop_report_record, set_report_record
from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    episode_from_record,
    episode_record,
)
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import EpisodeRunner
from pytest_memeval.model.loading import load_profile_model
from pytest_memeval.runtime.assertions import WrongAnswer
from pytest_memeval.runtime.devices import worker_device
from pytest_memeval.runtime.episodes.items import EpisodeState, env_maker
from pytest_memeval.runtime.state import is_worker

__all__ = [
    "WORKER_NAME",
    "EnvironmentFailure",
    "EpisodeFailed",
    "EpisodeWorker",
    "check_episode",
    "memeval_episode",
    "memeval_episode_seed",
]

WORKER_NAME = "memeval-episode-worker"
_RECORD_KEY = pytest.StashKey[EpisodeRecord]()


class EpisodeFailed(WrongAnswer):
    """The episode ended without success; the message says how (``Episode.summary()``), and
    is the one line the terminal shows for it by default (runtime/failures.py)."""


class EnvironmentFailure(Exception):
    """The environment failed under the episode: an error of the run, not the model's."""


def check_episode(record: EpisodeRecord) -> None:
    """The assertion of ``test_episode``: the episode succeeded."""
    __tracebackhide__ = True  # the failure is the episode's summary, not this frame
    if not record["success"]:
        summary = episode_from_record(record).summary()
        raise EpisodeFailed(summary, summary)


class EpisodeWorker:
    """This process's policy and environment, and each item's record on its report."""

    def __init__(self, config: pytest.Config, state: EpisodeState) -> None:
        self.config = config
        self.state = state
        self._policy: ModelPolicy | None = None
        self.runner = EpisodeRunner(state.spec, env_maker(config), system=state.profile.system)

    def policy(self) -> ModelPolicy:
        """The checkpoint as the policy, loaded on first use."""
        if self._policy is None:
            profile = self.state.profile
            loaded = load_profile_model(profile, worker_device(self.config))
            self._policy = ModelPolicy(loaded, profile.generation.max_new_tokens)
        return self._policy

    def run(self, item: pytest.Item, seed: int) -> EpisodeRecord:
        """The episode of ``seed``, its record attached to ``item``'s report."""
        episode = self.runner.run(seed, self.policy())
        record = episode_record(self.state.spec, episode)
        item.stash[_RECORD_KEY] = record
        # On the item's report: JUnit XML writes them as the test case's <properties>.
        item.user_properties.extend(
            [
                ("memeval_seed", seed),
                ("memeval_reason", record["reason"]),
                ("memeval_steps", record["steps"]),
                ("memeval_score", record["score"]),
                ("memeval_invalid_actions", episode.invalid_actions),
            ]
        )
        return record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        record = item.stash.get(_RECORD_KEY, None)
        # The call's report, or the setup's when the environment failed there.
        if record is not None and (report.when == "call" or report.failed):
            set_report_record(report, dict(record))
            del item.stash[_RECORD_KEY]

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if is_worker(self.config):
            drop_report_record(report)  # sent to the controller by now

    def pytest_sessionfinish(self) -> None:
        self.runner.close()

    def pytest_unconfigure(self) -> None:
        self.runner.close()  # idempotent: a session that ended early still closes its env


def _worker(config: pytest.Config) -> EpisodeWorker:
    plugin = config.pluginmanager.get_plugin(WORKER_NAME)
    if plugin is None:
        pytest.skip("no closed-loop profile: episode items need --ckpt NAME with an 'env'")
    assert isinstance(plugin, EpisodeWorker)
    return plugin


@pytest.fixture
def memeval_episode_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this episode item (parametrized by the plugin over ``env.seeds``)."""
    seed: int = request.param
    return seed


@pytest.fixture
def memeval_episode(request: pytest.FixtureRequest, memeval_episode_seed: int) -> EpisodeRecord:
    """This item's episode, run now; an environment failure is an error of the item."""
    record = _worker(request.config).run(request.node, memeval_episode_seed)
    if record["reason"] == "env_error":
        raise EnvironmentFailure(episode_from_record(record).summary())
    return record
