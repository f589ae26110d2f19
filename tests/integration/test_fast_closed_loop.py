"""The closed loop's fast policy against the reference, whole trajectories in the simulator.

:class:`~pytest_memeval.decode.fast.FastPolicy` keeps each episode's cache across steps and
steps episodes together; every action of every step of every episode must be the reference
policy's (:class:`~pytest_memeval.decode.policy.ModelPolicy`: the whole conversation through
``generate`` at each step). Compared in TextWorld Express (``twc``) on the demo checkpoint
(fp32 and bf16) and on SmolLM2-135M-Instruct (fp32 zero-shot, bf16 with the trained ``twc``
adapter), one episode at a time and stepped together, with the episodes' conversations (what
the next prompt would be) compared too. The plugin's own runs
compare the two paths in ``test_episode_shards.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_memeval.core.cache import resolve_cache_dir
from pytest_memeval.decode.fast import CalibrationStore, FastPolicy
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.env import Episode, EpisodeRunner, Policy
from pytest_memeval.model.gguf import convert_gguf
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, REPO
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
        # in one row with segment attention: the demo's attention allows it
        assert stats.flat_extend_passes == stats.extend_passes > 0
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


def test_demo_bf16_trajectories_together_are_the_reference_ones(
    demo_runner: EpisodeRunner,
) -> None:
    """bf16: the bounds in ulps of the top logit (``bounds.py``), the same discipline."""
    loaded = load_model(BASE_MODEL, ADAPTERS / "oracle", dtype="bfloat16")
    reference = _alone(demo_runner, ModelPolicy(loaded, 6))
    fast = FastPolicy(loaded, 6)
    together = demo_runner.run_together(list(demo_runner.spec.seeds), fast.decide)
    assert _plain(together) == _plain(reference)
    assert fast.bounds.relative  # 16-bit: ulps, not fp32 units
    assert fast.stats.cached == fast.stats.steps - fast.stats.reference_steps > 0


def test_smollm2_bf16_trajectories_together_are_the_reference_ones(smollm2_gguf: Path) -> None:
    """The real model in bf16 with the trained closed-loop adapter (``twc``): three
    episodes stepped together, four steps each unless won sooner. bf16 matrix products on a
    CPU without bf16 instructions are slow, so the episodes are short, and the policy
    calibrates on its first 2 cached steps instead of 8: the same guard, its bound set from
    fewer measurements (never below the bf16 prior in ulps), so more decisions are trusted to
    the cached computation and identical trajectories prove more, not less."""
    import torch

    require_textworld()
    torch.set_num_threads(1)  # the machines are shared: one thread is the fair share
    conversion = convert_gguf(smollm2_gguf, resolve_cache_dir())
    adapter = REPO / "demo" / "checkpoint" / "smol-adapters" / "twc"
    loaded = load_model(conversion.directory, adapter, dtype="bfloat16")
    with EpisodeRunner(twc_spec(seeds="0-2", max_steps=4)) as runner:
        reference = _alone(runner, ModelPolicy(loaded, 16))
        fast = FastPolicy(loaded, 16, calibration_steps=2)
        together = runner.run_together(list(runner.spec.seeds), fast.decide)
    assert _plain(together) == _plain(reference)
    assert fast.bounds.relative  # 16-bit: the bound in ulps of the top logit
    assert fast.stats.calibration_steps == 2
    assert fast.stats.cached == fast.stats.steps - fast.stats.reference_steps > 0
    assert fast.stats.flat_extend_passes == fast.stats.extend_passes > 0


def test_a_stored_calibration_is_reused_and_the_trajectories_are_the_same(
    demo: LoadedModel, demo_runner: EpisodeRunner, tmp_path: Path
) -> None:
    """The policy's calibration kept in the cache directory (``stored.py``): measured and
    stored by the first policy, reused by the next one (no calibrating steps), measured
    again when the entry is damaged or the run recalibrates; the actions never change."""
    weights = {"model": "sha256:demo-base", "adapter": "sha256:demo-oracle"}
    seeds = list(demo_runner.spec.seeds)
    reference = _plain(_alone(demo_runner, ModelPolicy(demo, 6)))

    def run(store: CalibrationStore) -> FastPolicy:
        policy = FastPolicy(demo, 6, store=store)
        assert _plain(demo_runner.run_together(seeds, policy.decide)) == reference
        return policy

    first = run(CalibrationStore(tmp_path, weights))
    outcome = first.calibration_outcome
    assert outcome is not None and outcome.source == "measured" and outcome.entry is not None
    assert first.stats.calibration_steps == 8 and first.stats.calibration_seconds > 0
    stored = json.loads(outcome.entry.read_text("utf-8"))
    assert stored["key"]["setting"]["measured_by"] == "closed_loop_policy"  # apart from
    # the teacher-forced decoder's entries

    second = run(CalibrationStore(tmp_path, weights))
    assert second.calibration_outcome is not None
    assert second.calibration_outcome.source == "reused"
    assert second.calibration_outcome.entry == outcome.entry
    assert second.stats.calibration_steps == 0
    assert second.stats.cached == first.stats.cached + 8  # the calibrating steps, trusted
    assert second.bounds.absolute["generate"] == first.bounds.absolute["generate"]

    outcome.entry.write_text('{"format": "garbage"', "utf-8")  # damaged: measured again
    third = run(CalibrationStore(tmp_path, weights))
    assert third.calibration_outcome is not None
    assert third.calibration_outcome.source == "measured"
    assert json.loads(outcome.entry.read_text("utf-8"))["run"] == ""  # replaced, whole

    fresh = run(CalibrationStore(tmp_path, weights, run="again", fresh=True))
    assert fresh.calibration_outcome is not None
    assert fresh.calibration_outcome.source == "measured"  # --memeval-recalibrate
