"""Hook specifications of pytest-memeval (all ``pytest_memeval_*``).

Implement them in a ``conftest.py`` or a plugin. Arguments may be added in later versions,
never renamed or removed (pluggy lets implementations take any subset of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_memeval.core.profiles import Profile
    from pytest_memeval.core.records import Metrics, Record
    from pytest_memeval.decode import Decoder


@pytest.hookspec(firstresult=True)
def pytest_memeval_build_benchmark(
    config: pytest.Config, builder: str, options: Mapping[str, Any], rootdir: Path
) -> Iterable[Mapping[str, Any]] | None:
    """Build the scenario records of a profile whose ``benchmark`` is a builder table.

    Return the records (each ``{"id", "messages", "memory_chain"?}``, the benchmark JSONL
    format) if ``builder`` is yours, else ``None``. ``options`` are the table's other keys;
    resolve relative paths against ``rootdir`` (the directory of the profile's file). The
    bundled ``scene_memory`` builder is implemented this way. Runs on the controller and on
    every xdist worker, so it must be deterministic.
    """


@pytest.hookspec(firstresult=True)
def pytest_memeval_make_decoder(
    config: pytest.Config, profile: Profile, path: str, device: str, history: str
) -> Decoder | None:
    """Create the decoder for this worker (return ``None`` to let the next one decide).

    Called once per worker, before the first eval item runs. The default implementation
    loads the profile's model and adapter and returns the ``path`` decoder (``fast`` or
    ``reference``) for ``history`` (``truth``: teacher-forced; ``model``: free-running, each
    turn's prompt holding the decoder's own earlier outputs); a replay profile gets the
    replay decoder. Each rollout says its history (``Rollout.history``); a rollout of
    another history than the run's stops the scenario with an error naming both, so a
    decoder that knows only teacher-forcing cannot pass for a free-running one.
    """


def pytest_memeval_record(config: pytest.Config, record: Record) -> None:
    """A scenario record reached the controller (and was journaled). Plain JSON data."""


def pytest_memeval_run_written(config: pytest.Config, run_dir: Path, metrics: Metrics) -> None:
    """A run's ``predictions.jsonl`` and ``metrics.json`` are written (recounted, final).

    ``run_dir`` is where they are: the top of the run directory (``runs/<ckpt>/``,
    ``--memeval-out``) for a finished run, which was promoted there; for a run that did not
    finish (a subset, missing scenarios, a stop), its own ``subsets/<UTC time>/`` directory
    beside the finished run (docs/results-schema.md). Either way ``metrics`` are those of this
    run and complete for it; whether the run covers its whole scope is in
    ``metrics["complete"]``, ``["missing"]`` and ``["not_selected"]``. Not called when a run
    writes nothing (no eval item selected, a start-up failure, a recount disagreement, or a
    resume with nothing left to do).
    """
