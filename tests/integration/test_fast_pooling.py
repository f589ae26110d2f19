"""Generation pooled over forward passes, and a calibration reused by another decoder of the
same model: both give the reference path's rollouts (real model)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import KINDS, FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

MAX_NEW = 16

# Slow: every test decodes the demo model on both paths, several dtypes.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_only() -> Iterator[LoadedModel]:
    """The base model without an adapter: wrong on many turns, so most turns are generated."""
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, None)


def _scenarios(n: int) -> list[Scenario]:
    return list(from_records(demo_records("baseline", n), "demo").scenarios)


def _outputs(rollouts: Sequence[Rollout]) -> list[list[tuple[str, bool | None]]]:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


@pytest.fixture(scope="module")
def oracle() -> Iterator[LoadedModel]:
    """The oracle adapter: its answers depend on the conversation's history, so a row
    continued from another pass's cache (the wrong history) gives other answers."""
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


@pytest.mark.parametrize("which", ["base_only", "oracle"])
def test_turns_of_several_forward_passes_share_generate_calls(
    which: str, request: pytest.FixtureRequest
) -> None:
    loaded: LoadedModel = request.getfixturevalue(which)
    scenarios = _scenarios(8)
    fast = FastDecoder(loaded, MAX_NEW, batch_size=1)
    rollouts = fast.decode(scenarios)
    reference = ReferenceDecoder(loaded, MAX_NEW)
    assert _outputs(rollouts) == _outputs([reference.rollout(s) for s in scenarios])
    # Eight forward passes of one scenario each; their undecided turns were settled in
    # fewer calls (verification passes and generate calls) than passes, so rows of different
    # passes' caches shared a call.
    assert fast.stats.generated_mismatch > 1
    calls = fast.stats.generate_calls + fast.stats.verify_passes
    assert 0 < calls < len(scenarios)
    # ... and every one of them continued from its own pass's cache: none fell back to a
    # generation without the cache or to the reference call (which would hide a wrong cut).
    assert fast.stats.generated_without_cache == 0
    assert fast.stats.generated_reference_rerun == 0
    assert all(r.batch == 1 for r in rollouts)


def test_a_calibration_is_adopted_by_another_decoder_of_the_model(
    base_only: LoadedModel,
) -> None:
    scenarios = _scenarios(4)
    first = FastDecoder(base_only, MAX_NEW)
    first.decode(scenarios[:2])
    assert first.stats.calibration_turns > 0
    second = FastDecoder(base_only, MAX_NEW)
    assert second.adopt_calibration(first)
    rollouts = second.decode(scenarios[2:])
    assert second.stats.calibration_turns == 0  # nothing measured again
    for kind in KINDS:
        assert second.bounds.absolute[kind] == first.bounds.absolute[kind]
        assert second.bounds.disagreement(kind) == first.bounds.disagreement(kind)
    reference = ReferenceDecoder(base_only, MAX_NEW)
    assert _outputs(rollouts) == _outputs([reference.rollout(s) for s in scenarios[2:]])
    # A decoder with a given margin keeps it; one that measured nothing has nothing to give.
    fixed = FastDecoder(base_only, MAX_NEW, margin=0.5)
    fixed.adopt_calibration(first)
    assert set(fixed.bounds.absolute.values()) == {0.5}
    assert not FastDecoder(base_only, MAX_NEW).adopt_calibration(fixed)


def test_a_calibration_of_another_model_is_refused(base_only: LoadedModel) -> None:
    other = load_model(BASE_MODEL, ADAPTERS / "oracle")
    with pytest.raises(ValueError, match="only valid for the model"):
        FastDecoder(other, MAX_NEW).adopt_calibration(FastDecoder(base_only, MAX_NEW))
