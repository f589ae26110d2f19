"""The closed loop's fast policy against the reference, whole trajectories in the simulator.

:class:`~pytest_memeval.decode.fast.FastPolicy` keeps each episode's cache across steps and
steps episodes together; every action of every step of every episode must be the reference
policy's (:class:`~pytest_memeval.decode.policy.ModelPolicy`: the whole conversation through
``generate`` at each step). Compared in TextWorld Express (``twc``) on the demo checkpoint
and on SmolLM2-135M-Instruct in fp32, one episode at a time and stepped together, with the
episodes' conversations (what the next prompt would be) compared too. The plugin's own runs
compare the two paths in ``test_episode_shards.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_memeval.core.cache import resolve_cache_dir
from pytest_memeval.decode.fast import FastPolicy
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import Episode, EpisodeRunner, Policy
from pytest_memeval.model.gguf import convert_gguf
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL
from ..envs import require_textworld, twc_spec

pytestmark = pytest.mark.slow


def _alone(runner: EpisodeRunner, policy: Policy) -> list[Episode]:
    return [runner.run(seed, policy) for seed in runner.spec.seeds]


def _plain(episodes: list[Episode]) -> list[tuple[object, ...]]:
    return [(e.as_plain(), e.messages) for e in episodes]


@pytest.fixture(scope="module")
def demo_runner() -> Iterator[EpisodeRunner]:
    require_textworld()
    with EpisodeRunner(twc_spec(seeds="0-5", max_steps=8)) as runner:
        yield runner


@pytest.fixture(scope="module")
def demo() -> LoadedModel:
    return load_model(BASE_MODEL, ADAPTERS / "oracle")


def test_demo_trajectories_alone_and_together_are_the_reference_ones(
    demo: LoadedModel, demo_runner: EpisodeRunner
) -> None:
    reference = _alone(demo_runner, ModelPolicy(demo, 6))
    alone = FastPolicy(demo, 6)
    assert _plain(_alone(demo_runner, alone)) == _plain(reference)
    together = FastPolicy(demo, 6)
    assert _plain(demo_runner.run_together(list(demo_runner.spec.seeds), together.decide)) == (
        _plain(reference)
    )
    for stats in (alone.stats, together.stats):
        assert stats.steps == sum(len(e.steps) for e in reference)
        assert stats.calibration_steps == 8 and stats.first_steps == 1
        assert stats.cached == stats.steps - stats.reference_steps > 0
        assert stats.reused_tokens > 5 * stats.extended_tokens
    assert together.stats.generate_calls < alone.stats.generate_calls
    assert demo_runner.made == 6  # one environment per episode stepped together, kept


def test_a_decision_inside_the_bound_goes_to_the_reference_call(
    demo: LoadedModel, demo_runner: EpisodeRunner
) -> None:
    """A bound no decision clears: every cached step is decoded again by the reference call
    (the guard's path), and the trajectories are still the reference's."""
    seeds = [0, 1, 2]
    reference = [demo_runner.run(s, ModelPolicy(demo, 6)) for s in seeds]
    guarded = FastPolicy(demo, 6, margin=1e9)
    assert _plain(demo_runner.run_together(seeds, guarded.decide)) == _plain(reference)
    stats = guarded.stats
    assert stats.cached == 0 and stats.calibration_steps == 0
    assert stats.near_tie == stats.steps - stats.first_steps > 0


def test_smollm2_fp32_trajectories_together_are_the_reference_ones(smollm2_gguf: Path) -> None:
    """A real pretrained model (zero-shot: long, varied outputs, 16 new tokens), four
    episodes stepped together for four steps."""
    import torch

    require_textworld()
    torch.set_num_threads(1)  # the machines are shared: one thread is the fair share
    conversion = convert_gguf(smollm2_gguf, resolve_cache_dir())
    loaded = load_model(conversion.directory, None)
    with EpisodeRunner(twc_spec(seeds="0-3", max_steps=4)) as runner:
        reference = _alone(runner, ModelPolicy(loaded, 16))
        fast = FastPolicy(loaded, 16)
        together = runner.run_together(list(runner.spec.seeds), fast.decide)
    assert _plain(together) == _plain(reference)
    assert fast.stats.cached == fast.stats.steps - fast.stats.reference_steps > 0
    assert any(s.truncated_output for e in reference for s in e.steps)  # outputs reach 16
