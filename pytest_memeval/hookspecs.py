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
    from pytest_memeval.env import EnvSpec, TextEnv
    from pytest_memeval.tools.publish import FinishedRun


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
    replay decoder (with ``device`` ``"cpu"``: a replay decodes nothing, and the worker does
    not import torch for it). Load the model from ``profile.model_dir`` (a GGUF ``model``'s
    safetensors conversion, or the model directory) and the tokenizer from
    ``profile.tokenizer_dir``. Each rollout says its history (``Rollout.history``); a
    rollout of another history than the run's stops the scenario with an error naming both,
    so a decoder that knows only teacher-forcing cannot pass for a free-running one.
    """


@pytest.hookspec(firstresult=True)
def pytest_memeval_make_env(config: pytest.Config, spec: EnvSpec) -> TextEnv | None:
    """Make the environment of a profile's ``env`` table (return ``None`` to let the next
    one decide).

    Return an object with the :class:`~pytest_memeval.env.TextEnv` protocol (``reset(seed,
    options)``, ``step(action)``, ``close()``; docs/closed-loop.md) if ``spec.backend`` is
    yours. Asked before the built-in backends (``textworld_express``, ``gymnasium``), so a
    plugin can also replace one. Raise :class:`~pytest_memeval.env.EnvSetupError` for what
    the user must install or fix: it is reported as one usage error. The caller owns the
    environment it gets and closes it.
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


def pytest_memeval_run_finished(config: pytest.Config, run: FinishedRun) -> None:
    """The session is over and its run is final: publish it (CI summary, JUnit, a tracker).

    Called once per session, on the controller (never on an xdist worker), after every
    ``pytest_sessionfinish`` implementation ran: the run directory is written and recounted,
    the gate (if any) has decided the exit status, and the files of pytest's ``--junitxml``
    and pytest-html's ``--html`` are on disk. ``run``
    (:class:`~pytest_memeval.tools.publish.FinishedRun`) says where the run's files are, its
    metrics, the resolved profile, the gate's outcome and the session's exit status.

    Called for every run the session wrote, finished or not: ``run.complete`` is true only
    for a run that evaluated every scenario of its benchmark (not a ``-k`` subset, a run with
    missing scenarios, a stopped run or a shard); an implementation that keeps history (an
    experiment tracker) should skip the others, as the bundled MLflow logger does. Not called
    when the session wrote no run (see :func:`pytest_memeval_run_written`).

    A closed-loop run (a profile with an ``env`` table, docs/closed-loop.md) is published
    too: then ``run.kind == "episodes"`` and ``run.episodes`` holds its ``metrics.json``
    (``EpisodeRunMetrics``: success with its 95% interval, mean score, steps, invalid
    actions, termination reasons, slices); ``run.metrics`` is that same document, which
    shares ``kind``, ``profile``, ``complete`` and ``fingerprints`` with a scenario run's and
    has no ``m1``/``m2``: an implementation that knows only scenario runs should return when
    ``run.episodes is not None``. ``run.gate`` is the closed-loop gate's outcome
    (``--memeval-min-success``, ``--memeval-baseline``) or ``None`` without one, and
    ``run.run_dir`` is where its files are, as for a scenario run (the top of the run
    directory once finished, else its ``subsets/<UTC time>/``). For a scenario run
    ``run.episodes`` is ``None`` (``run.kind == "scenarios"``).

    The bundled step summary (``$GITHUB_STEP_SUMMARY``, ``--memeval-summary-md``), the JUnit
    properties (``--junitxml``) and the MLflow logger (``--memeval-mlflow``) are
    implementations of this hook. Say what you published with
    :func:`pytest_memeval.tools.publish.report_output` (a line in the terminal summary).
    Each implementation is called on its own: one that raises is reported in red in the
    terminal summary, the others still run, and the exit status stands (a tracker that is
    down does not fail an eval). docs/ci-and-tracking.md has an example.
    """
