"""A closed-loop run's pytest side: its items and their state (``items.py``), the worker that
plays each item's episode (``worker.py``) and the controller that journals and finishes the
run (``controller.py``)."""

from pytest_memeval.runtime.episodes.controller import (
    CONTROLLER_NAME,
    EpisodeController,
    deselect_resumed,
    finished_run,
)
from pytest_memeval.runtime.episodes.items import (
    EPISODE_STATE_KEY,
    build_episode_state,
    parametrize_episodes,
    provide_episode_items,
)
from pytest_memeval.runtime.episodes.worker import (
    WORKER_NAME,
    EpisodeFailed,
    EpisodeWorker,
    check_episode,
    memeval_episode,
    memeval_episode_seed,
)

__all__ = [
    "CONTROLLER_NAME",
    "EPISODE_STATE_KEY",
    "WORKER_NAME",
    "EpisodeController",
    "EpisodeFailed",
    "EpisodeWorker",
    "build_episode_state",
    "check_episode",
    "deselect_resumed",
    "finished_run",
    "memeval_episode",
    "memeval_episode_seed",
    "parametrize_episodes",
    "provide_episode_items",
]
