"""One environment for a process's episodes: made on first use, remade after an error, closed.

An xdist worker (or a plain run) runs many episodes of one ``env`` table. Starting an
environment can be slow (TextWorld Express starts a JVM), so :class:`EpisodeRunner` makes it
once, on the first episode, and runs every later episode in it; an episode that ends in an
environment error leaves the environment suspect, so the runner closes it then and the next
episode gets a new one. ``close`` (or leaving the ``with`` block) closes the one it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from pytest_memeval.env.episode import Episode, Policy, run_episode
from pytest_memeval.env.protocol import TextEnv
from pytest_memeval.env.registry import make_env
from pytest_memeval.env.spec import EnvSpec

__all__ = ["EpisodeRunner"]


class EpisodeRunner:
    """Runs the episodes of ``spec`` in one environment at a time.

    ``make`` makes the environment (default :func:`~pytest_memeval.env.registry.make_env`;
    the runtime passes one that asks the ``pytest_memeval_make_env`` hook first). ``system``
    is the profile's system text (``None``: each episode's task description).
    """

    def __init__(
        self,
        spec: EnvSpec,
        make: Callable[[EnvSpec], TextEnv] = make_env,
        *,
        system: str | None = None,
    ) -> None:
        self.spec = spec
        self.system = system
        self._make = make
        self._env: TextEnv | None = None
        #: environments made so far (one, unless an error made the runner replace one)
        self.made = 0

    @property
    def env(self) -> TextEnv:
        """The environment the next episode runs in (made now if there is none)."""
        if self._env is None:
            self._env = self._make(self.spec)
            self.made += 1
        return self._env

    def run(self, seed: int, policy: Policy, options: Mapping[str, Any] | None = None) -> Episode:
        """One episode of ``seed`` (one of the spec's seeds) with the spec's limits."""
        if seed not in self.spec.seeds:
            raise ValueError(f"seed {seed} is not among env.seeds of this run")
        episode = run_episode(
            self.env,
            seed,
            policy,
            self.spec.max_steps,
            system=self.system,
            invalid_action_limit=self.spec.invalid_action_limit,
            step_timeout_s=self.spec.step_timeout_s,
            options=options,
        )
        if episode.is_error:
            self.close()  # suspect now: the next episode starts a new one
        return episode

    def close(self) -> None:
        """Close the environment held, if any (a later episode makes a new one)."""
        env, self._env = self._env, None
        if env is not None:
            env.close()

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
