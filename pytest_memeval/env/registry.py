"""Which code makes the environment a spec names: a plugin's hook first, then a built-in.

The built-in backends are ``textworld_express`` (:mod:`~pytest_memeval.env.textworld`) and
``gymnasium`` (:mod:`~pytest_memeval.env.gym_adapter`: ``game`` is a registered Gymnasium
id). A plugin provides any other backend (or replaces a built-in one) by implementing the
``pytest_memeval_make_env(config, spec)`` hook; the caller passes the hook's call as
``plugin`` to :func:`make_env`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_memeval.env import gym_adapter, textworld
from pytest_memeval.env.protocol import EnvSetupError, TextEnv
from pytest_memeval.env.spec import EnvSpec

__all__ = ["BUILTIN_BACKENDS", "EnvFactory", "describe_env", "make_env"]

#: makes the environment of a spec (raises EnvSetupError when it cannot here)
EnvFactory = Callable[[EnvSpec], TextEnv]

BUILTIN_BACKENDS: Mapping[str, EnvFactory] = {
    textworld.BACKEND: textworld.TextWorldExpress,
    gym_adapter.BACKEND: gym_adapter.make_gymnasium,
}


def make_env(spec: EnvSpec, plugin: Callable[[EnvSpec], TextEnv | None] | None = None) -> TextEnv:
    """The environment of ``spec``: ``plugin(spec)`` if it returns one, else a built-in.

    An unknown backend is one :class:`EnvSetupError` listing the built-in ones.
    """
    if plugin is not None:
        made = plugin(spec)
        if made is not None:
            return made
    factory = BUILTIN_BACKENDS.get(spec.backend)
    if factory is None:
        raise EnvSetupError(
            f"env.backend: no backend {spec.backend!r}; built in: "
            f"{', '.join(sorted(BUILTIN_BACKENDS))} (a plugin adds one with the "
            "pytest_memeval_make_env hook)"
        )
    return factory(spec)


def describe_env(env: TextEnv, spec: EnvSpec) -> dict[str, Any]:
    """What a run's fingerprint says of its environment: the spec (backend, game, parameters,
    fold, seeds, limits), updated with the env's own ``describe()`` where it has one (the
    built-in backends: their package's version, the fold they resolved)."""
    described = spec.as_plain()
    own = getattr(env, "describe", None)
    if callable(own):
        described.update(own())
    return described
