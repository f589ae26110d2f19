"""One episode: a policy acts in an environment until it ends, with the reason it ended.

The runner is model-agnostic. A *policy* maps the conversation so far to the next action::

    system     the profile's ``system`` text, else the environment's task description
    user       the first observation, stripped
    assistant  the policy's output, stripped: it is also the action sent to ``step``
    user       the next observation, stripped
    ...

(a model-backed policy renders it with the chat template and decodes greedily). It returns
the action text, or a :class:`PolicyOutput` that also says whether the output was cut off
at the token limit; it raises :class:`ContextLimitExceeded` when the conversation no longer
fits the model.

An environment that raises, or takes longer than ``step_timeout_s`` over a reset or a step,
ends the episode with :attr:`TerminationReason.ENV_ERROR`: an error of the environment,
never the model's failure. Such an environment may be broken; its owner closes it and
makes a new one before the next episode.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, TypedDict, TypeVar

from pytest_memeval.env.protocol import EnvError, EnvInfo, StepResult, TextEnv

__all__ = [
    "BatchPolicy",
    "ContextLimitExceeded",
    "Episode",
    "Message",
    "Policy",
    "PolicyOutput",
    "StepRecord",
    "TerminationReason",
    "run_episode",
    "run_episodes",
]

_T = TypeVar("_T")
#: an environment error's message is kept to this many characters (a Java stack trace is long)
_ERROR_CHARS = 500


class Message(TypedDict):
    """One chat message, as chat templates take them."""

    role: str
    content: str


class PolicyOutput(NamedTuple):
    """A policy's action, and whether the model's output stopped at its token limit."""

    text: str
    truncated: bool = False


#: the conversation so far -> the next action
Policy = Callable[[Sequence[Message]], "str | PolicyOutput"]

#: several conversations -> each one's next action, or the :class:`ContextLimitExceeded` its
#: policy call alone would raise (the lockstep runner's policy: :func:`run_episodes`)
BatchPolicy = Callable[
    [Sequence[Sequence[Message]]], "Sequence[str | PolicyOutput | ContextLimitExceeded]"
]


class ContextLimitExceeded(Exception):
    """Raised by a policy when the conversation no longer fits its model's context."""


class TerminationReason(str, Enum):
    """Why an episode ended (its value is what records store)."""

    #: the environment said the task succeeded
    SUCCESS = "success"
    #: the environment ended the task without success
    FAILURE = "failure"
    #: ``max_steps`` actions and the task not over
    STEP_LIMIT = "step_limit"
    #: the environment's own limit cut the episode (Gymnasium's ``truncated``)
    ENV_TRUNCATED = "env_truncated"
    #: ``invalid_action_limit`` invalid actions in a row
    INVALID_ACTIONS = "invalid_actions"
    #: the policy's model ran out of context
    CONTEXT_LIMIT = "context_limit"
    #: the environment raised or hung: an error, not the model's failure
    ENV_ERROR = "env_error"


@dataclass(frozen=True)
class StepRecord:
    """One action and what the environment answered."""

    action: str
    observation: str
    reward: float
    #: the score after the step (``None``: the environment keeps none)
    score: float | None
    #: the action was among the environment's valid actions (``None``: it lists none)
    valid: bool | None
    #: the model's output stopped at its token limit and was sent as it was
    truncated_output: bool = False

    def as_plain(self) -> dict[str, Any]:
        """JSON-able."""
        return {
            "action": self.action,
            "observation": self.observation,
            "reward": self.reward,
            "score": self.score,
            "valid": self.valid,
            "truncated_output": self.truncated_output,
        }


@dataclass(frozen=True)
class Episode:
    """A finished episode: its steps, how it ended, and the conversation the policy saw."""

    seed: int
    reason: TerminationReason
    steps: tuple[StepRecord, ...]
    #: the first observation (``""`` when reset failed)
    observation: str
    #: the conversation, ending with the last observation
    messages: tuple[Message, ...]
    #: the final score: the environment's last score, else the sum of rewards
    score: float
    #: what the environment raised (reason ENV_ERROR only)
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.reason is TerminationReason.SUCCESS

    @property
    def is_error(self) -> bool:
        """The environment failed: the episode says nothing about the model."""
        return self.reason is TerminationReason.ENV_ERROR

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(s.action for s in self.steps)

    @property
    def invalid_actions(self) -> int:
        return sum(1 for s in self.steps if s.valid is False)

    def summary(self) -> str:
        """One line on how the episode ended, for a failure message."""
        words = self.reason.value.replace("_", " ")
        line = f"seed {self.seed}: {words} after {len(self.steps)} action(s)"
        if self.invalid_actions:
            line += f" ({self.invalid_actions} invalid)"
        line += f", score {self.score:g}"
        if self.error is not None:
            line += f"; {self.error}"
        elif self.steps:
            last = self.steps[-1]
            line += f"; last {last.action!r} -> {_first_line(last.observation)!r}"
        return line

    def as_plain(self) -> dict[str, Any]:
        """JSON-able (the reason by its value)."""
        return {
            "seed": self.seed,
            "success": self.success,
            "reason": self.reason.value,
            "score": self.score,
            "steps": len(self.steps),
            "error": self.error,
            "observation": self.observation,
            "trajectory": [s.as_plain() for s in self.steps],
        }


def run_episode(
    env: TextEnv,
    seed: int,
    policy: Policy,
    max_steps: int,
    *,
    system: str | None = None,
    invalid_action_limit: int | None = None,
    step_timeout_s: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> Episode:
    """Reset ``env`` to ``seed`` and let ``policy`` act until the episode ends.

    Ends (:class:`TerminationReason`): the environment says success or failure or truncates,
    ``max_steps`` actions, ``invalid_action_limit`` invalid actions in a row (``None``: no
    limit), the policy's :class:`ContextLimitExceeded`, or an environment error or a call
    over ``step_timeout_s`` seconds (``None``: no timeout). An exception of the policy's
    other than that one propagates: it is the model side's error, not an episode's end.
    """

    def decide(
        conversations: Sequence[Sequence[Message]],
    ) -> list[str | PolicyOutput | ContextLimitExceeded]:
        return [_answer(policy, messages) for messages in conversations]

    # One episode is a batch of one: the one loop, for both.
    return run_episodes(
        [env],
        [seed],
        decide,
        max_steps,
        system=system,
        invalid_action_limit=invalid_action_limit,
        step_timeout_s=step_timeout_s,
        options=options,
    )[0]


def _answer(
    policy: Policy, messages: Sequence[Message]
) -> str | PolicyOutput | ContextLimitExceeded:
    """``policy``'s action, or the :class:`ContextLimitExceeded` it raised (any other
    exception propagates: the model side's error, not an episode's end)."""
    try:
        return policy(tuple(messages))
    except ContextLimitExceeded as exc:
        return exc


def run_episodes(
    envs: Sequence[TextEnv],
    seeds: Sequence[int],
    decide: BatchPolicy,
    max_steps: int,
    *,
    system: str | None = None,
    invalid_action_limit: int | None = None,
    step_timeout_s: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[Episode]:
    """Episode ``seeds[i]`` in ``envs[i]``, all stepped together: at each step the episodes
    still under way hand their conversations to ``decide`` in one call (a batched policy),
    then each sends its action to its own environment.

    The episodes share nothing but the call: each ends for its own reason (as
    :func:`run_episode` lists them; ``decide`` answers a conversation that no longer fits
    with the :class:`ContextLimitExceeded` instead of raising it), the others going on
    without it. :func:`run_episode` is this with one episode.
    """
    if len(envs) != len(seeds):
        raise ValueError(f"{len(seeds)} seeds need as many environments, not {len(envs)}")
    ended: dict[int, Episode] = {}
    runs: dict[int, _Run] = {}
    for n, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
        try:
            observation, info = _reset_result(
                _timed(functools.partial(env.reset, seed, options), step_timeout_s, "reset")
            )
        except Exception as exc:
            ended[n] = Episode(seed, TerminationReason.ENV_ERROR, (), "", (), 0.0, _describe(exc))
            continue
        system_text = system if system is not None else (info.task_description or "")
        runs[n] = _Run(seed, observation, system_text, info)
    for _ in range(max_steps):
        if not runs:
            break
        live = list(runs)
        outputs = decide([tuple(runs[n].messages) for n in live])
        if len(outputs) != len(live):
            raise TypeError(f"a batch policy answered {len(outputs)} of {len(live)} conversations")
        for n, output in zip(live, outputs, strict=True):
            outcome = _advance(envs[n], runs[n], output, invalid_action_limit, step_timeout_s)
            if outcome.reason is not None:
                ended[n] = runs.pop(n).end(outcome.reason, outcome.error)
    for n, run in runs.items():
        ended[n] = run.end(TerminationReason.STEP_LIMIT)
    return [ended[n] for n in range(len(seeds))]


def _advance(
    env: TextEnv,
    run: _Run,
    output: str | PolicyOutput | ContextLimitExceeded,
    invalid_action_limit: int | None,
    step_timeout_s: float | None,
) -> _Outcome:
    """One step of ``run`` with the policy's ``output``: why the episode ends with it, if
    it does."""
    if isinstance(output, ContextLimitExceeded):
        return _Outcome(TerminationReason.CONTEXT_LIMIT)
    text, truncated = _action(output)
    try:
        result = _step_result(_timed(functools.partial(env.step, text), step_timeout_s, "step"))
    except Exception as exc:
        return _Outcome(TerminationReason.ENV_ERROR, _describe(exc))
    return _Outcome(run.record(text, truncated, result, invalid_action_limit))


class _Outcome(NamedTuple):
    """How one step left an episode: ended for ``reason`` (``None``: going on), and what
    the environment raised (``ENV_ERROR`` only)."""

    reason: TerminationReason | None
    error: str | None = None


class _Run:
    """An episode under way: the conversation, the steps, the state the next step reads."""

    def __init__(self, seed: int, observation: str, system: str, info: EnvInfo) -> None:
        self.seed = seed
        self.observation = observation
        self.messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": observation.strip()},
        ]
        self.steps: list[StepRecord] = []
        self.info = info
        self.streak = 0
        self.rewards = 0.0

    def record(
        self, action: str, truncated: bool, result: StepResult, limit: int | None
    ) -> TerminationReason | None:
        """Keep one step; the reason the episode ends with it, or ``None``."""
        allowed = self.info.valid_actions
        valid = None if allowed is None else action in allowed
        self.steps.append(
            StepRecord(
                action,
                result.observation,
                result.reward,
                result.info.score,
                valid,
                truncated,
            )
        )
        self.messages.append({"role": "assistant", "content": action})
        self.messages.append({"role": "user", "content": result.observation.strip()})
        self.info = result.info
        self.rewards += result.reward
        self.streak = self.streak + 1 if valid is False else 0
        if result.info.success:
            return TerminationReason.SUCCESS
        if result.terminated or result.info.failure:
            return TerminationReason.FAILURE
        if result.truncated:
            return TerminationReason.ENV_TRUNCATED
        if limit is not None and self.streak >= limit:
            return TerminationReason.INVALID_ACTIONS
        return None

    def end(self, reason: TerminationReason, error: str | None = None) -> Episode:
        score = self.info.score if self.info.score is not None else self.rewards
        return Episode(
            self.seed,
            reason,
            tuple(self.steps),
            self.observation,
            tuple(self.messages),
            score,
            error,
        )


def _reset_result(result: object) -> tuple[str, EnvInfo]:
    """``reset``'s answer checked against the protocol (a plugin's env may not keep it)."""
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], str)
        and isinstance(result[1], EnvInfo)
    ):
        return result[0], result[1]
    raise EnvError(f"reset() must return (str, EnvInfo), got {_shape(result)}")


def _step_result(result: object) -> StepResult:
    """``step``'s answer checked against the protocol: a StepResult (or its five values)."""
    if isinstance(result, tuple) and len(result) == 5:
        step = StepResult(*result)
        if isinstance(step.observation, str) and isinstance(step.info, EnvInfo):
            return StepResult(
                step.observation,
                float(step.reward),
                bool(step.terminated),
                bool(step.truncated),
                step.info,
            )
    raise EnvError(
        "step() must return a StepResult (observation: str, reward, terminated, truncated, "
        f"info: EnvInfo), got {_shape(result)}"
    )


def _shape(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(type(v).__name__ for v in value) + ")"
    return type(value).__name__


def _action(output: str | PolicyOutput) -> tuple[str, bool]:
    if isinstance(output, PolicyOutput):
        return output.text.strip(), output.truncated
    if isinstance(output, str):
        return output.strip(), False
    raise TypeError(f"a policy returns str or PolicyOutput, not {type(output).__name__}")


def _timed(call: Callable[[], _T], timeout: float | None, what: str) -> _T:
    """``call()``, or :class:`EnvError` if it has not returned after ``timeout`` seconds.

    The call runs in a daemon thread so that a hung environment cannot hang the run; the
    thread stays blocked until the environment is closed (which ends its process).
    """
    if timeout is None:
        return call()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"memeval-env-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise EnvError(f"the environment's {what}() did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    value: _T = box["value"]
    return value


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."
