"""Any Gymnasium environment with text observations and actions, as a ``TextEnv``.

:class:`GymnasiumTextEnv` wraps an object with Gymnasium's API (``reset(seed=, options=)``
returning ``(obs, info)``, ``step(action)`` returning five values, ``close()``): a
``gymnasium.Env``, or anything shaped like one (duck-typed, so gymnasium itself is needed only
to ``make`` an env by id). The info dict's conventional keys become :class:`EnvInfo` fields:

- success: the first of ``is_success`` (Stable-Baselines3's convention), ``success``,
  ``won`` (ALFWorld) that the info holds; an env that reports none never succeeds;
- valid actions: ``valid_actions``, else ``admissible_commands`` (TextWorld, ALFWorld);
- ``score``, ``failure``, ``task_description``: under those names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pytest_memeval.compat import installed_version
from pytest_memeval.env.protocol import EnvError, EnvInfo, EnvSetupError, StepResult
from pytest_memeval.env.spec import EnvSpec

__all__ = ["BACKEND", "SUCCESS_KEYS", "VALID_ACTION_KEYS", "GymnasiumTextEnv", "make_gymnasium"]

BACKEND = "gymnasium"
SUCCESS_KEYS = ("is_success", "success", "won")
VALID_ACTION_KEYS = ("valid_actions", "admissible_commands")
_TYPED_KEYS = (*SUCCESS_KEYS, *VALID_ACTION_KEYS, "score", "failure", "task_description")


class GymnasiumTextEnv:
    """A :class:`~pytest_memeval.env.protocol.TextEnv` over a Gymnasium-API env."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, EnvInfo]:
        """``env.reset(seed=seed, options=options)``, its observation checked to be text."""
        result = self.env.reset(seed=seed, options=None if options is None else dict(options))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise EnvError(
                "reset() must return (observation, info) as Gymnasium 0.26 and later do, "
                f"got {type(result).__name__}"
            )
        observation, info = result
        return _text(observation, "reset"), _env_info(info)

    def step(self, action: str) -> StepResult:
        """``env.step(action)``, its five values checked and typed."""
        result = self.env.step(action)
        if not (isinstance(result, tuple) and len(result) == 5):
            size = len(result) if isinstance(result, tuple) else type(result).__name__
            raise EnvError(
                "step() must return (observation, reward, terminated, truncated, info) as "
                f"Gymnasium 0.26 and later do, got {size} values"
            )
        observation, reward, terminated, truncated, info = result
        return StepResult(
            _text(observation, "step"),
            float(reward),
            bool(terminated),
            bool(truncated),
            _env_info(info),
        )

    def describe(self) -> dict[str, Any]:
        """The backend and gymnasium's version, for a fingerprint."""
        return {"backend": BACKEND, "version": installed_version("gymnasium")}

    def close(self) -> None:
        """``env.close()``."""
        self.env.close()


def make_gymnasium(spec: EnvSpec) -> GymnasiumTextEnv:
    """``gymnasium.make(spec.game, **params)``, refused unless its observations are text."""
    try:
        import gymnasium
    except ImportError as exc:
        raise EnvSetupError(
            f"the {BACKEND} backend needs gymnasium, which is not installed ({exc}): "
            "pip install gymnasium"
        ) from exc
    try:
        kwargs: dict[str, Any] = dict(spec.params)
        env = gymnasium.make(spec.game, **kwargs)
    except gymnasium.error.Error as exc:
        raise EnvSetupError(
            f"env.game: gymnasium cannot make {spec.game!r} ({exc}); "
            "`python -c 'import gymnasium; gymnasium.pprint_registry()'` lists the ids"
        ) from exc
    for name in ("observation_space", "action_space"):
        space = getattr(env, name, None)
        if space is not None and not isinstance(space, gymnasium.spaces.Text):
            env.close()
            raise EnvSetupError(
                f"env.game: {spec.game!r} has a {type(space).__name__} {name}; the "
                "closed loop needs text observations and actions (gymnasium.spaces.Text)"
            )
    return GymnasiumTextEnv(env)


def _text(observation: object, call: str) -> str:
    if not isinstance(observation, str):
        raise EnvError(f"{call}() gave a {type(observation).__name__} observation, not text")
    return observation


def _env_info(info: object) -> EnvInfo:
    if not isinstance(info, Mapping):
        raise EnvError(f"the info must be a dict, got {type(info).__name__}")
    success = next((bool(info[k]) for k in SUCCESS_KEYS if k in info), None)
    actions = next((info[k] for k in VALID_ACTION_KEYS if k in info), None)
    score, failure, task = info.get("score"), info.get("failure"), info.get("task_description")
    return EnvInfo(
        task_description=None if task is None else str(task),
        valid_actions=None if actions is None else tuple(str(a) for a in actions),
        score=None if score is None else float(score),
        success=success,
        failure=None if failure is None else bool(failure),
        extra={str(k): v for k, v in info.items() if k not in _TYPED_KEYS and _plain(v)},
    )


def _plain(value: object) -> bool:
    """JSON-able (records are JSON): a numpy array or an object in the info is left out."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
