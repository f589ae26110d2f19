"""The closed loop's eval item. Import it into a test module to run a profile's episodes::

    # contracts/test_episodes.py
    from pytest_memeval.episodes import test_episode  # noqa: F401

With ``--ckpt NAME`` naming a profile with an ``env`` table (docs/closed-loop.md), the plugin
parametrizes it over the table's seeds: ``test_episode[<game>-<seed>]``, one episode each,
whose assertion is the episode's success (the failure says how it ended). Where no collected
module imports it, the plugin provides it as ``memeval::test_episode[<game>-<seed>]``.
"""

from __future__ import annotations

from pytest_memeval.core.episode_records import EpisodeRecord
from pytest_memeval.runtime.episodes import EpisodeFailed, check_episode

__all__ = ["EpisodeFailed", "check_episode", "test_episode"]


def test_episode(memeval_episode: EpisodeRecord) -> None:
    """The model acted in the environment until the episode ended; it must have succeeded."""
    __tracebackhide__ = True
    check_episode(memeval_episode)
