"""The worker side of a closed-loop run: one model and one environment per process.

Each process that runs episode items (an xdist worker, or the single process) loads the
checkpoint once, at its first episode, as the policy (``decode/fast.FastPolicy`` by default,
its calibration kept in the cache directory; ``--memeval-decode reference``:
``decode/policy.ModelPolicy``, one greedy ``generate`` over the whole conversation per
action, the reference decoder), and holds
one :class:`~pytest_memeval.env.EpisodeRunner`: the environment is started at the first
episode, replaced after an environment error, and closed when the process's session ends (no
JVM is left behind). Each item's episode record rides on its report to the controller, as a
scenario's record does; an environment error is raised in the item's setup, so the item is
an *error*, never a failure of the model.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

import pytest

from pytest_memeval.compat.pytest import drop_report_record, set_report_record
from pytest_memeval.compat.xdist import pending_item_indices
from pytest_memeval.core.episode_records import (
    EpisodeRecord,
    episode_from_record,
    episode_record,
)
from pytest_memeval.decode.fast import (
    EPISODES_TOGETHER,
    CalibrationStore,
    FastPolicy,
    weight_fingerprints,
)
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import EpisodeRunner
from pytest_memeval.model.loading import load_profile_model
from pytest_memeval.runtime.assertions import WrongAnswer
from pytest_memeval.runtime.devices import worker_device
from pytest_memeval.runtime.episodes.items import EpisodeState, env_maker, item_seed
from pytest_memeval.runtime.session import cache_dir, recalibrate_requested
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
    """This process's policy and environment, and each item's record on its report.

    With the fast decode path, the item that finds its episode not yet run runs it together
    with the next episodes this process is certain to run (up to :data:`EPISODES_TOGETHER`:
    without xdist the session's next items, under xdist the items already queued on this
    worker, which the controller sends in chunks of that many: runtime/scheduler.py), stepped
    as one batch by :class:`~pytest_memeval.decode.fast.FastPolicy`; their records wait for
    their own items. The reference path runs one episode per item.
    """

    def __init__(self, config: pytest.Config, state: EpisodeState) -> None:
        self.config = config
        self.state = state
        self._policy: ModelPolicy | None = None
        self.runner = EpisodeRunner(state.spec, env_maker(config), system=state.profile.system)
        #: records of episodes run ahead of their items, by seed
        self._ahead: dict[int, EpisodeRecord] = {}

    def policy(self) -> ModelPolicy:
        """The checkpoint as the policy, loaded on first use."""
        if self._policy is None:
            profile = self.state.profile
            loaded = load_profile_model(profile, worker_device(self.config))
            max_new = profile.generation.max_new_tokens
            if self.state.decode_path == "fast":
                self._policy = FastPolicy(loaded, max_new, store=self._calibration_store())
            else:
                self._policy = ModelPolicy(loaded, max_new)
        return self._policy

    def _calibration_store(self) -> CalibrationStore:
        """Where the fast policy's calibration is kept between runs and processes: the
        cache directory, keyed by the model's fingerprints (``decode/fast/stored.py``);
        ``--memeval-recalibrate``: this process measures it again."""
        return CalibrationStore(
            cache_dir(self.config),
            weight_fingerprints(self.state.fingerprints),
            run=uuid.uuid4().hex,
            fresh=recalibrate_requested(self.config),
        )

    def run(self, item: pytest.Item, seed: int) -> EpisodeRecord:
        """The episode of ``seed``, its record attached to ``item``'s report."""
        record = self._ahead.pop(seed, None)
        if record is None:
            record = self._run_from(item, seed)
        item.stash[_RECORD_KEY] = record
        # On the item's report: JUnit XML writes them as the test case's <properties>.
        invalid = sum(1 for step in record["trajectory"] if step["valid"] is False)
        item.user_properties.extend(
            [
                ("memeval_seed", seed),
                ("memeval_reason", record["reason"]),
                ("memeval_steps", record["steps"]),
                ("memeval_score", record["score"]),
                ("memeval_invalid_actions", invalid),
            ]
        )
        return record

    def _run_from(self, item: pytest.Item, seed: int) -> EpisodeRecord:
        """Run ``seed``'s episode (with the fast path, together with the next ones)."""
        policy = self.policy()
        seeds = [seed]
        if isinstance(policy, FastPolicy):
            seeds += self._upcoming(item, seed)[: EPISODES_TOGETHER - 1]
        if len(seeds) == 1:
            episodes = [self.runner.run(seed, policy)]
        else:
            assert isinstance(policy, FastPolicy)
            episodes = self.runner.run_together(seeds, policy.decide)
        records = [episode_record(self.state.spec, episode) for episode in episodes]
        self._ahead.update(zip(seeds[1:], records[1:], strict=True))
        return records[0]

    def _upcoming(self, item: pytest.Item, seed: int) -> list[int]:
        """Seeds of the episode items this process certainly runs after ``item``, in order."""
        items = item.session.items
        if is_worker(self.config):
            indices = pending_item_indices(self.config) or []  # None: nothing known, alone
            after = [items[i] for i in indices if 0 <= i < len(items)]
        else:
            position = next((n for n, it in enumerate(items) if it is item), len(items))
            after = items[position + 1 :]
        seeds = []
        for other in after:
            s = item_seed(other)
            if s is not None and s != seed and s not in seeds and s not in self._ahead:
                seeds.append(s)
        return seeds

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
