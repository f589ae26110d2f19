"""The environment protocol: Gymnasium's ``reset``/``step``/``close``, typed, with text.

An environment a model acts in is anything with these three methods
(:class:`TextEnv`, a structural :class:`~typing.Protocol`: no base class to inherit)::

    observation, info = env.reset(seed, options)     # a new episode
    observation, reward, terminated, truncated, info = env.step(action)
    env.close()                                       # its processes are gone afterwards

This is Gymnasium's shape (``terminated``: the task ended, in success or failure;
``truncated``: a limit of the environment's own cut it), with text observations and actions
and a typed :class:`EnvInfo` in place of the free-form ``info`` dict: the fields an evaluator
reads (task description, valid actions, score, success, failure) have one name whatever the
backend calls them, and everything else the backend said stays in ``EnvInfo.extra``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "EnvError",
    "EnvInfo",
    "EnvSetupError",
    "EnvSpecError",
    "StepResult",
    "TextEnv",
]


class EnvSpecError(ValueError):
    """A profile's ``env`` table is malformed; the message names the key."""


class EnvSetupError(RuntimeError):
    """An environment cannot be made here: a missing package, Java, or an unknown game.

    A usage error: the message says what to install or which names exist.
    """


class EnvError(RuntimeError):
    """The environment itself failed during an episode (it raised, hung or its process died).

    Never the model's failure: an episode that meets it is an error, not a failed episode.
    """


@dataclass(frozen=True)
class EnvInfo:
    """What an environment says beside its observation, under backend-neutral names.

    ``None`` means the backend does not say (for example a Gymnasium env without valid
    actions), never "false" or "zero".
    """

    #: the task in words (TextWorld Express: ``taskDescription``)
    task_description: str | None = None
    #: the actions the environment accepts now; ``None``: it does not list them
    valid_actions: tuple[str, ...] | None = None
    #: the score so far, 0 to 1 where the backend normalizes it
    score: float | None = None
    #: the task is done and succeeded
    success: bool | None = None
    #: the task is done and failed (it can no longer succeed)
    failure: bool | None = None
    #: the backend's other fields, JSON-able
    extra: Mapping[str, Any] = field(default_factory=dict)


class StepResult(NamedTuple):
    """What :meth:`TextEnv.step` returns: Gymnasium's five values, the info typed."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: EnvInfo


@runtime_checkable
class TextEnv(Protocol):
    """An environment with text observations and text actions (Gymnasium's protocol).

    ``reset`` with the same ``seed`` and ``options`` must give the same episode: the same
    observation, and the same observations for the same actions after it (an episode is
    replayable, and a test checks it for each built-in backend).
    """

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, EnvInfo]:
        """Start the episode of ``seed``; return its first observation and info."""
        ...

    def step(self, action: str) -> StepResult:
        """Send ``action``; return the new observation, reward, ends and info."""
        ...

    def close(self) -> None:
        """Release the environment (its processes are gone when this returns)."""
        ...
