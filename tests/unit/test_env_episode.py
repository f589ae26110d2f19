"""The episode runner: the conversation a policy sees, each end and its reason, env errors.

The environment is a real ``gymnasium.Env`` (tests/envs.py, checked by Gymnasium's own
``check_env``) through the Gymnasium adapter; the environment faults (raising, hanging) are
small environments of their own below. TextWorld Express episodes: tests/integration/
test_env_textworld.py.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from pytest_memeval.env import (
    ContextLimitExceeded,
    EnvInfo,
    GymnasiumTextEnv,
    Message,
    PolicyOutput,
    StepResult,
    TerminationReason,
    TextEnv,
    run_episode,
    run_episodes,
)

from ..envs import WORDS, require_gymnasium, say_the_word_env, scripted


@pytest.fixture(scope="module")
def say_cls() -> type[Any]:
    return say_the_word_env(require_gymnasium())


@pytest.fixture
def env(say_cls: type[Any]) -> GymnasiumTextEnv:
    return GymnasiumTextEnv(say_cls())


def _target(env: GymnasiumTextEnv, seed: int) -> str:
    observation, _ = env.reset(seed)
    return observation.split()[-1].rstrip(".")


def test_the_test_env_is_a_valid_gymnasium_env(say_cls: type[Any]) -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(say_cls(), skip_render_check=True)  # its reset-seed determinism check included


def test_the_adapter_is_a_text_env_and_resets_deterministically(env: GymnasiumTextEnv) -> None:
    assert isinstance(env, TextEnv)
    first = [env.reset(seed) for seed in range(6)]
    again = [env.reset(seed) for seed in reversed(range(6))][::-1]
    assert first == again
    assert len({obs for obs, _ in first}) > 1, "the seeds pick different words"
    observation, info = first[0]
    assert info == EnvInfo("Say the secret word.", WORDS, 0.0, None, None, {})
    assert observation.endswith("  \n")  # the env's own text; the runner strips it


def test_a_winning_policy_succeeds_and_the_conversation_follows_the_contract(
    env: GymnasiumTextEnv,
) -> None:
    target = _target(env, 3)
    wrong = next(w for w in WORDS if w != target)
    episode = run_episode(env, 3, scripted([f"  {wrong}\n", target]), max_steps=5)
    assert episode.reason is TerminationReason.SUCCESS and episode.success
    assert episode.actions == (wrong, target)
    assert [s.valid for s in episode.steps] == [True, True]
    assert episode.score == 1.0 and not episode.is_error and episode.error is None
    assert list(episode.messages) == [
        {"role": "system", "content": "Say the secret word."},  # the env's task description
        {"role": "user", "content": f"Say the word {target}."},  # stripped
        {"role": "assistant", "content": wrong},  # the model's output, stripped
        {"role": "user", "content": "Not that one."},
        {"role": "assistant", "content": target},
        {"role": "user", "content": "Yes!"},
    ]


def test_the_policy_sees_the_conversation_so_far_and_the_profiles_system_text(
    env: GymnasiumTextEnv,
) -> None:
    seen: list[list[Message]] = []

    def policy(messages: Sequence[Message]) -> str:
        seen.append(list(messages))
        return "zebra"

    episode = run_episode(env, 0, policy, max_steps=3, system="You play a word game.")
    assert [len(m) for m in seen] == [2, 4, 6]
    assert seen[0][0] == {"role": "system", "content": "You play a word game."}
    assert seen[-1] == list(episode.messages[:6])
    assert episode.reason is TerminationReason.STEP_LIMIT
    assert len(episode.steps) == 3 and episode.invalid_actions == 3
    assert [s.observation for s in episode.steps] == ["Unknown word."] * 3


def test_an_invalid_action_streak_ends_the_episode_only_where_a_limit_is_set(
    env: GymnasiumTextEnv,
) -> None:
    target = _target(env, 1)
    wrong = next(w for w in WORDS if w != target)
    # two invalid, one valid but wrong (the streak starts again), then three invalid
    actions = ["zebra", "yak", wrong, "zebra", "yak", "zebra"]
    unlimited = run_episode(env, 1, scripted(actions), max_steps=6)
    assert unlimited.reason is TerminationReason.STEP_LIMIT
    assert unlimited.actions == tuple(actions) and unlimited.invalid_actions == 5
    three = run_episode(env, 1, scripted(actions), max_steps=10, invalid_action_limit=3)
    assert three.reason is TerminationReason.INVALID_ACTIONS
    assert three.actions == tuple(actions)  # not at the 4th action: the valid one reset it
    two = run_episode(env, 1, scripted(actions), max_steps=10, invalid_action_limit=2)
    assert two.reason is TerminationReason.INVALID_ACTIONS and two.actions == ("zebra", "yak")


def test_the_environments_own_limit_is_truncation(say_cls: type[Any]) -> None:
    env = GymnasiumTextEnv(say_cls(max_turns=2))
    episode = run_episode(env, 0, scripted(["zebra"] * 5), max_steps=5)
    assert episode.reason is TerminationReason.ENV_TRUNCATED and len(episode.steps) == 2


def test_context_limit_and_the_truncated_output_flag(env: GymnasiumTextEnv) -> None:
    calls = iter([PolicyOutput("apple banana cherry", truncated=True)])

    def policy(messages: Sequence[Message]) -> PolicyOutput:
        try:
            return next(calls)
        except StopIteration:
            raise ContextLimitExceeded("the next prompt is 2049 tokens") from None

    episode = run_episode(env, 0, policy, max_steps=5)
    assert episode.reason is TerminationReason.CONTEXT_LIMIT and not episode.success
    assert [(s.action, s.truncated_output, s.valid) for s in episode.steps] == [
        ("apple banana cherry", True, False)
    ]


def test_a_policy_error_is_not_an_episode_end(env: GymnasiumTextEnv) -> None:
    def policy(messages: Sequence[Message]) -> str:
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        run_episode(env, 0, policy, max_steps=3)


class _Faulty:
    """An environment that fails as told: on ``reset`` or at step ``at``, by raising or
    by hanging until released."""

    def __init__(self, where: str, how: str, at: int = 0) -> None:
        self.where, self.how, self.at, self.steps = where, how, at, 0
        self.release = threading.Event()

    def _fail(self) -> None:
        if self.how == "raise":
            raise ConnectionError("py4j: the Java VM is gone")
        self.release.wait(30)

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, EnvInfo]:
        if self.where == "reset":
            self._fail()
        return "A room.", EnvInfo(task_description="Tidy up.")

    def step(self, action: str) -> StepResult:
        if self.where == "step" and self.steps == self.at:
            self._fail()
        self.steps += 1
        return StepResult("Nothing happens.", 0.0, False, False, EnvInfo())

    def close(self) -> None:
        self.release.set()


@pytest.mark.parametrize("where", ["reset", "step"])
@pytest.mark.parametrize("how", ["raise", "hang"])
def test_an_environment_that_raises_or_hangs_is_an_error_not_a_failure(
    where: str, how: str
) -> None:
    env = _Faulty(where, how, at=2)
    assert isinstance(env, TextEnv)
    try:
        episode = run_episode(env, 7, scripted(["look"] * 5), max_steps=5, step_timeout_s=0.3)
    finally:
        env.close()
    assert episode.reason is TerminationReason.ENV_ERROR
    assert episode.is_error and not episode.success and episode.seed == 7
    assert len(episode.steps) == (0 if where == "reset" else 2)
    expected = (
        "ConnectionError: py4j: the Java VM is gone"
        if how == "raise"
        else f"EnvError: the environment's {where}() did not return within 0.3 s"
    )
    assert episode.error == expected


def test_a_long_environment_error_is_shortened() -> None:
    class Verbose(_Faulty):
        def step(self, action: str) -> StepResult:
            raise RuntimeError("at java.lang.Thread.run\n" * 100)

    episode = run_episode(Verbose("step", "raise"), 0, scripted(["x"]), max_steps=1)
    assert episode.error is not None and len(episode.error) == 500
    assert episode.error.endswith("...")


def test_an_episode_is_plain_json(env: GymnasiumTextEnv) -> None:
    import json

    target = _target(env, 2)
    plain = run_episode(env, 2, scripted(["zebra", target]), max_steps=4).as_plain()
    assert json.loads(json.dumps(plain)) == plain
    assert plain["reason"] == "success" and plain["success"] is True and plain["steps"] == 2
    assert plain["trajectory"][0] == {
        "action": "zebra",
        "observation": "Unknown word.",
        "reward": 0.0,
        "score": 0.0,
        "valid": False,
        "truncated_output": False,
    }


def test_an_environment_breaking_the_protocol_is_an_environment_error(
    say_cls: type[Any],
) -> None:
    """A plugin handing over a raw Gymnasium env (a dict info), not the typed protocol."""
    raw = say_cls()

    class Untyped:
        def reset(self, seed: int, options: Any = None) -> Any:
            return raw.reset(seed=seed)

        def step(self, action: str) -> Any:
            return raw.step(action)

        def close(self) -> None:
            raw.close()

    episode = run_episode(Untyped(), 0, scripted(["apple"]), max_steps=1)
    assert episode.reason is TerminationReason.ENV_ERROR and episode.steps == ()
    assert episode.error == "EnvError: reset() must return (str, EnvInfo), got (str, dict)"

    class HalfTyped(Untyped):
        def reset(self, seed: int, options: Any = None) -> Any:
            return GymnasiumTextEnv(raw).reset(seed)

    episode = run_episode(HalfTyped(), 0, scripted(["apple"]), max_steps=1)
    assert episode.reason is TerminationReason.ENV_ERROR
    assert episode.error == (
        "EnvError: step() must return a StepResult (observation: str, reward, terminated, "
        "truncated, info: EnvInfo), got (str, float, bool, bool, dict)"
    )


def _guessing_policy(messages: Sequence[Message]) -> str:
    """A deterministic policy over the conversation: the words in turn, then the one the
    first observation names (so episodes of different seeds end after different steps)."""
    said = sum(1 for m in messages if m["role"] == "assistant")
    named = messages[1]["content"].split()[-1].rstrip(".")
    return WORDS[said] if said < 2 else named


def test_episodes_stepped_together_are_each_the_episode_run_alone(say_cls: type[Any]) -> None:
    seeds = [0, 1, 2, 3, 4, 5]
    alone = [run_episode(GymnasiumTextEnv(say_cls()), s, _guessing_policy, 4) for s in seeds]
    asked: list[int] = []

    def decide(conversations: Sequence[Sequence[Message]]) -> list[str]:
        asked.append(len(conversations))
        return [_guessing_policy(m) for m in conversations]

    envs = [GymnasiumTextEnv(say_cls()) for _ in seeds]
    together = run_episodes(envs, seeds, decide, 4)
    assert [e.as_plain() for e in together] == [e.as_plain() for e in alone]
    assert [e.messages for e in together] == [e.messages for e in alone]
    # one call per step for all episodes under way; an ended episode leaves the batch
    assert asked[0] == len(seeds) and asked == sorted(asked, reverse=True)
    assert len(asked) == max(len(e.steps) for e in alone)
    assert {e.reason for e in alone} >= {TerminationReason.SUCCESS}


def test_one_episode_ending_by_error_or_context_leaves_the_others_going(
    say_cls: type[Any],
) -> None:
    faulty = _Faulty("step", "raise", at=1)
    envs: list[TextEnv] = [GymnasiumTextEnv(say_cls()), faulty, GymnasiumTextEnv(say_cls())]
    calls = 0

    def decide(
        conversations: Sequence[Sequence[Message]],
    ) -> list[str | PolicyOutput | ContextLimitExceeded]:
        nonlocal calls
        calls += 1
        out: list[str | PolicyOutput | ContextLimitExceeded] = []
        for m in conversations:
            if m[0]["content"] == "Say the secret word." and len(m) >= 5:
                out.append(ContextLimitExceeded("the next prompt is 2049 tokens"))
            else:
                out.append(PolicyOutput("look", truncated=True))
        return out

    try:
        first, broken, third = run_episodes(envs, [0, 9, 1], decide, 6, step_timeout_s=5)
    finally:
        faulty.close()
    assert first.reason is third.reason is TerminationReason.CONTEXT_LIMIT
    assert len(first.steps) == len(third.steps) == 2
    assert broken.reason is TerminationReason.ENV_ERROR and len(broken.steps) == 1
    assert broken.error == "ConnectionError: py4j: the Java VM is gone"
    assert all(s.truncated_output for s in first.steps)
    assert calls == 3


def test_episodes_together_need_an_environment_each_and_an_answer_each(
    say_cls: type[Any],
) -> None:
    with pytest.raises(ValueError, match="2 seeds need as many environments, not 1"):
        run_episodes([GymnasiumTextEnv(say_cls())], [0, 1], lambda c: ["x"] * len(c), 2)
    envs = [GymnasiumTextEnv(say_cls()) for _ in range(2)]
    with pytest.raises(TypeError, match="answered 1 of 2 conversations"):
        run_episodes(envs, [0, 1], lambda c: ["x"], 2)
