"""Free-running decoding (``history="model"``) is exact: the fast path's rollouts equal the
reference path's turn for turn, on the demo (both adapters and the base model alone, which
leaves the truth on most scenarios), in float32 and 16-bit, one scenario at a time and
batched (the family checkpoints: ``test_families.py``, which also checks the reference against
a user's own free-running loop).

Two properties tie free-running to teacher-forced decoding and are checked on the way: up to
and including the first turn where the model leaves the truth, the free-running prompts *are*
the teacher-forced ones, so the outputs are the teacher-forced outputs; and a scenario that
never leaves the truth is decoded exactly as teacher-forced, final answer included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.history import fed_back
from pytest_memeval.decode import Rollout, make_model_decoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

pytestmark = pytest.mark.slow

MAX_NEW = 16

# (adapter, data variant, dtype), as test_fast_decode.py's cases.
DEMO_CASES = {
    "baseline": ("baseline", "baseline", "float32"),
    "oracle": ("oracle", "oracle", "float32"),
    "base-only": (None, "baseline", "float32"),
    "oracle-bf16": ("oracle", "oracle", "bfloat16"),
    "base-only-fp16": (None, "baseline", "float16"),
}


def outputs(rollout: Rollout) -> list[tuple[str, bool | None]]:
    return [(o.text, o.stopped) for o in rollout.outputs]


def assert_exact(fast: Sequence[Rollout], reference: Sequence[Rollout]) -> None:
    for f, r in zip(fast, reference, strict=True):
        assert f.history == r.history == "model"
        assert outputs(f) == outputs(r)
        assert f.prompt_tail == r.prompt_tail


def assert_shares_the_teacher_forced_turns(
    scenario: Scenario, free: Rollout, forced: Rollout
) -> bool:
    """Up to and including the first departure, free-running = teacher-forced; never
    departing, everything is. Returns whether the scenario left the truth."""
    targets = [scenario.messages[k]["content"] for k in scenario.assistant_indices]
    for i, (f, t) in enumerate(zip(free.outputs, forced.outputs, strict=True)):
        assert f.text == fed_back(t.text) and f.stopped == t.stopped, (scenario.id, i)
        if i < len(targets) - 1 and f.text != targets[i]:
            return True  # from here on the prompts differ
    assert free.prompt_tail == forced.prompt_tail
    return False


class DemoCase:
    def __init__(self, loaded: LoadedModel, variant: str) -> None:
        self.loaded = loaded
        self.scenarios = list(from_records(demo_records(variant, 6), variant).scenarios)
        ref = ReferenceDecoder(loaded, MAX_NEW, history="model")
        self.reference = [ref.rollout(s) for s in self.scenarios]


@pytest.fixture(scope="module", params=list(DEMO_CASES))
def demo(request: pytest.FixtureRequest) -> Iterator[DemoCase]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared 2-core machines
    adapter, variant, dtype = DEMO_CASES[request.param]
    loaded = load_model(BASE_MODEL, ADAPTERS / adapter if adapter else None, dtype=dtype)
    yield DemoCase(loaded, variant)
    torch.set_num_threads(threads)


def test_demo_fast_free_running_equals_reference(demo: DemoCase) -> None:
    one_by_one = make_model_decoder("fast", demo.loaded, MAX_NEW, "model")
    assert_exact([one_by_one.rollout(s) for s in demo.scenarios], demo.reference)
    batched = make_model_decoder("fast", demo.loaded, MAX_NEW, "model")
    batched.prefetch(demo.scenarios)
    assert_exact([batched.rollout(s) for s in demo.scenarios], demo.reference)


def test_demo_free_running_starts_as_teacher_forced(demo: DemoCase) -> None:
    forced = ReferenceDecoder(demo.loaded, MAX_NEW)
    left = [
        assert_shares_the_teacher_forced_turns(s, free, forced.rollout(s))
        for s, free in zip(demo.scenarios, demo.reference, strict=True)
    ]
    assert any(left), "no scenario left the truth: the comparison proves nothing"
