"""One environment for a process's episodes: made on first use, remade after an error, closed.

An xdist worker (or a plain run) runs many episodes of one ``env`` table. Starting an
environment can be slow (TextWorld Express starts a JVM), so :class:`EpisodeRunner` makes it
once, on the first episode, and runs every later episode in it; an episode that ends in an
environment error leaves the environment suspect, so the runner closes it then and the next
episode gets a new one. ``close`` (or leaving the ``with`` block) closes the one it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from pytest_memeval.env.episode import BatchPolicy, Episode, Policy, run_episode, run_episodes
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
        #: the further environments :meth:`run_together` steps beside :attr:`env`
        self._more: list[TextEnv] = []
        #: environments made so far (one, unless an error made the runner replace one, or
        #: :meth:`run_together` ran several episodes at once)
        self.made = 0

    @property
    def env(self) -> TextEnv:
        """The environment the next episode runs in (made now if there is none)."""
        if self._env is None:
            self._env = self._make(self.spec)
            self.made += 1
        return self._env

    def start(self, count: int) -> None:
        """Make ``count`` environments now (:attr:`env` and the ones :meth:`run_together`
        steps beside it), so that a timed run does not start them (``memeval bench``)."""
        first = self.env  # made now if there is none
        assert first is self._env
        while len(self._more) < count - 1:
            self._more.append(self._make(self.spec))
            self.made += 1

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

    def run_together(self, seeds: Sequence[int], decide: BatchPolicy) -> list[Episode]:
        """The episodes of ``seeds`` stepped together (:func:`~.episode.run_episodes`), one
        environment each: :attr:`env` and as many more as needed, kept for the next call;
        an environment whose episode ended in an error is closed and replaced next time."""
        for seed in seeds:
            if seed not in self.spec.seeds:
                raise ValueError(f"seed {seed} is not among env.seeds of this run")
        self.start(len(seeds))
        envs = [self.env, *self._more[: len(seeds) - 1]]
        episodes = run_episodes(
            envs,
            seeds,
            decide,
            self.spec.max_steps,
            system=self.system,
            invalid_action_limit=self.spec.invalid_action_limit,
            step_timeout_s=self.spec.step_timeout_s,
        )
        broken = {id(env) for env, ep in zip(envs, episodes, strict=True) if ep.is_error}
        if id(self._env) in broken:
            self._close_first()
        for env in [e for e in self._more if id(e) in broken]:
            self._more.remove(env)
            env.close()
        return episodes

    def close(self) -> None:
        """Close the environments held, if any (a later episode makes a new one)."""
        more, self._more = self._more, []
        for env in more:
            env.close()
        self._close_first()

    def _close_first(self) -> None:
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
