"""TextWorld Express, for real: a JVM per environment, the protocol, episodes, no JVM left.

One environment (one JVM) serves the module; the tests that start or end JVMs of their own
check by pid that each is gone after ``close``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from pytest_memeval.compat import textworld_express as ctwx
from pytest_memeval.env import (
    EnvSetupError,
    EnvSpec,
    Episode,
    EpisodeRunner,
    TerminationReason,
    TextEnv,
    TextWorldExpress,
    describe_env,
    make_env,
    run_episode,
)

from ..envs import TWC_TABLE, is_running, java_children, require_textworld, scripted, twc_spec

# Each test starts TextWorld Express JVMs: not the inner loop.
pytestmark = pytest.mark.slow

SEEDS = range(6)


@pytest.fixture(scope="module")
def twx() -> Iterator[TextWorldExpress]:
    require_textworld()
    before = java_children()
    env = make_env(twc_spec())
    assert isinstance(env, TextWorldExpress)
    yield env
    env.close()
    assert java_children() == before, "the module's JVM outlived close()"


def _gold(env: TextWorldExpress, seed: int) -> tuple[str, ...]:
    env.reset(seed, {"gold_path": True})
    return env.gold_actions()


def test_the_backend_is_a_text_env_with_a_running_jvm(twx: TextWorldExpress) -> None:
    assert isinstance(twx, TextEnv)
    assert twx.pid is not None and twx.pid in java_children() and is_running(twx.pid)
    assert twx.describe() == {"backend": "textworld_express", "version": "1.1.0", "fold": "test"}
    no_fold = twc_spec(fold=None)
    described = describe_env(twx, no_fold)
    assert described == {**no_fold.as_plain(), "version": "1.1.0", "fold": "test"}
    assert described["params"] == {
        "includeDoors": 0,
        "limitInventorySize": 0,
        "numItemsToPutAway": 2,
        "numLocations": 1,
    }


def test_a_seed_resets_the_same_way_every_time(twx: TextWorldExpress) -> None:
    """Gymnasium's check_reset_seed_determinism, over seeds and in any order; asking for the
    gold path does not change the episode."""
    first = {seed: twx.reset(seed) for seed in SEEDS}
    for seed in reversed(SEEDS):
        assert twx.reset(seed) == first[seed]
        assert twx.reset(seed, {"gold_path": True}) == first[seed]
    assert len({obs for obs, _ in first.values()}) == len(SEEDS), "each seed its own room"
    observation, info = first[0]
    assert observation.startswith("You are in the ")
    assert info.task_description and "place them in their usual locations" in (
        info.task_description
    )
    assert info.valid_actions and "look around" in info.valid_actions
    assert (info.score, info.success, info.failure) == (0.0, False, False)
    with pytest.raises(ValueError, match=r"take the option gold_path, not \['gold'\]"):
        twx.reset(0, {"gold": True})


@pytest.mark.parametrize("seed", SEEDS)
def test_the_gold_path_of_a_seed_succeeds(twx: TextWorldExpress, seed: int) -> None:
    gold = _gold(twx, seed)
    twx.reset(seed)
    results = [twx.step(action) for action in gold]
    assert all(not r.terminated for r in results[:-1])
    last = results[-1]
    assert last.terminated and last.info.success and not last.info.failure
    assert last.info.score == 1.0 and sum(r.reward for r in results) == pytest.approx(1.0)


def test_an_episode_with_the_gold_path_as_policy_succeeds(twx: TextWorldExpress) -> None:
    gold = _gold(twx, 4)
    episode = run_episode(twx, 4, scripted(gold), max_steps=12, step_timeout_s=30)
    assert episode.reason is TerminationReason.SUCCESS and episode.success
    assert episode.actions == gold and episode.score == 1.0
    assert all(step.valid for step in episode.steps)
    assert episode.messages[0]["content"] == (
        "Your task is to pick up objects, then place them in their usual locations in the "
        "environment."
    )


def test_nonsense_hits_the_step_limit(twx: TextWorldExpress) -> None:
    episode = run_episode(twx, 2, scripted(["dance on the table"] * 12), max_steps=12)
    assert episode.reason is TerminationReason.STEP_LIMIT and not episode.success
    assert len(episode.steps) == 12 and episode.invalid_actions == 12 and episode.score == 0.0
    assert {s.observation for s in episode.steps} == {"Unknown action: I'm not sure what you mean."}
    limited = run_episode(twx, 2, scripted(["dance"] * 12), max_steps=12, invalid_action_limit=3)
    assert limited.reason is TerminationReason.INVALID_ACTIONS and len(limited.steps) == 3


def _mixed_policy_episode(env: TextEnv, gold: tuple[str, ...]) -> Episode:
    """Gold actions with invalid ones and a repeated look between them."""
    actions = [a for g in gold for a in (g, "dance", "look around")]
    return run_episode(env, 5, scripted(actions), max_steps=len(actions))


def test_a_stored_episodes_actions_replay_the_same_in_a_fresh_environment(
    twx: TextWorldExpress,
) -> None:
    stored = _mixed_policy_episode(twx, _gold(twx, 5))
    assert stored.reason is TerminationReason.SUCCESS and stored.invalid_actions > 0
    fresh = make_env(twc_spec())
    try:
        replayed = run_episode(fresh, 5, scripted(stored.actions), max_steps=len(stored.steps))
    finally:
        fresh.close()
    assert replayed == stored  # every observation, reward, score, validity and the end


def test_close_leaves_no_jvm_and_can_be_called_twice() -> None:
    require_textworld()
    env = make_env(twc_spec())
    assert isinstance(env, TextWorldExpress) and env.pid is not None
    pid = env.pid
    assert is_running(pid) and pid in java_children()
    env.reset(0)
    env.close()
    assert not is_running(pid) and pid not in java_children()
    env.close()
    raw = env._env  # the textworld_express env: its __del__ calls its close(), now a no-op
    assert raw.close() is None and ctwx.java_process(raw) is not None
    assert ctwx.java_process(raw).pid == pid  # type: ignore[union-attr]


def test_a_jvm_that_dies_mid_episode_is_an_environment_error() -> None:
    require_textworld()
    env = make_env(twc_spec())
    assert isinstance(env, TextWorldExpress) and env.pid is not None
    pid = env.pid

    def policy(messages: object) -> str:
        os.kill(pid, signal.SIGKILL)  # the simulator's process dies under the episode
        return "look around"

    try:
        episode = run_episode(env, 0, policy, max_steps=5, step_timeout_s=30)
    finally:
        env.close()
    assert episode.reason is TerminationReason.ENV_ERROR and episode.is_error
    assert not episode.success and episode.steps == () and episode.error
    assert not is_running(pid) and pid not in java_children()


def test_a_hung_jvm_is_a_timeout_error_and_close_kills_it() -> None:
    """A real hang: the JVM stopped (SIGSTOP) under a step. The step times out, and close,
    whose shutdown the stopped JVM cannot answer either, kills it after its grace period."""
    require_textworld()
    env = TextWorldExpress(twc_spec(), close_timeout_s=2)
    assert env.pid is not None
    pid = env.pid

    def policy(messages: object) -> str:
        os.kill(pid, signal.SIGSTOP)
        return "look around"

    try:
        episode = run_episode(env, 0, policy, max_steps=3, step_timeout_s=1)
    finally:
        env.close()
    assert episode.reason is TerminationReason.ENV_ERROR and episode.steps == ()
    assert episode.error == "EnvError: the environment's step() did not return within 1 s"
    assert not is_running(pid) and pid not in java_children()


def test_parameters_the_game_refuses_are_a_setup_error_and_no_jvm_is_left() -> None:
    require_textworld()
    before = java_children()
    with pytest.raises(EnvSetupError) as info:
        make_env(twc_spec(params={**dict(twc_spec().params), "numRooms": 2}))
    message = str(info.value)
    assert message.startswith("env.params: TextWorld Express refuses ")
    assert "Unrecognized property name (numRooms)" in message
    assert "Known properties: numLocations, numItemsToPutAway" in message
    assert java_children() == before


def test_a_runner_keeps_one_jvm_and_replaces_it_after_an_environment_error(
    twx: TextWorldExpress,
) -> None:
    gold = {seed: _gold(twx, seed) for seed in (0, 1, 3)}
    before = java_children()
    pids: list[int] = []

    def make(spec: EnvSpec) -> TextEnv:
        env = make_env(spec)
        assert isinstance(env, TextWorldExpress) and env.pid is not None
        pids.append(env.pid)
        return env

    def kill(messages: object) -> str:
        os.kill(pids[-1], signal.SIGKILL)
        return "look around"

    with EpisodeRunner(twc_spec(max_steps=8), make) as runner:
        assert runner.made == 0 and java_children() == before  # nothing started yet
        first = [runner.run(seed, scripted(gold[seed])) for seed in (0, 1)]
        assert [e.reason for e in first] == [TerminationReason.SUCCESS] * 2
        assert runner.made == 1
        broken = runner.run(2, kill)
        assert broken.reason is TerminationReason.ENV_ERROR and not is_running(pids[0])
        after = runner.run(3, scripted(gold[3]))
        assert after.reason is TerminationReason.SUCCESS and runner.made == 2
        assert is_running(pids[1])
        with pytest.raises(ValueError, match=r"seed 10 is not among env\.seeds"):
            runner.run(10, scripted(gold[0]))
    assert not is_running(pids[1]) and java_children() == before


def test_the_table_in_the_helper_is_the_documented_one() -> None:
    assert TWC_TABLE["backend"] == "textworld_express" and twc_spec().seeds == tuple(range(10))
