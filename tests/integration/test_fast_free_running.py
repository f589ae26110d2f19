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

import copy
import dataclasses
import math
from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.history import fed_back
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode import make_model_decoder
from pytest_memeval.decode.fast import FastDecoder
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
    one_by_one = FastDecoder(demo.loaded, MAX_NEW, history="model")
    assert_exact([one_by_one.rollout(s) for s in demo.scenarios], demo.reference)
    batched = make_model_decoder("fast", demo.loaded, MAX_NEW, "model")
    assert isinstance(batched, FastDecoder)
    batched.prefetch(demo.scenarios)
    fast = [batched.rollout(s) for s in demo.scenarios]
    assert_exact(fast, demo.reference)
    assert not any(r.notes for r in fast)
    stats = batched.stats
    turns = sum(len(r.outputs) for r in fast)
    # Every turn accepted once, in rounds; after the first, each round continued from the
    # cached prefix (the demo's cache can be cut), none ran the conversation again.
    assert stats.free_running_turns == turns
    assert stats.free_running_rounds > 1
    assert stats.free_running_cached_passes > 0
    assert stats.reference_scenarios == 0


def test_small_batches_and_every_decision_a_near_tie(demo: DemoCase) -> None:
    """Forward passes of 2 rows (rows of different lengths, continued from different
    caches) and a margin no decision clears (every turn settled by the reference call
    itself): the reference's rollouts either way."""
    small = FastDecoder(demo.loaded, MAX_NEW, history="model", batch_size=2)
    rollouts = small.decode(demo.scenarios)
    assert_exact(rollouts, demo.reference)
    # `mean batch M of B`: a scenario's batch is its forward pass's, never more than B (the
    # later rounds' continued passes hold more rows)
    assert all(1 <= r.batch <= r.batch_size <= 2 for r in rollouts)
    guarded = FastDecoder(demo.loaded, MAX_NEW, history="model", margin=math.inf)
    assert_exact(guarded.decode(demo.scenarios[:2]), demo.reference[:2])
    assert guarded.stats.generated_reference_rerun > 0


def test_prefix_property_failure_finishes_with_the_reference(demo: DemoCase) -> None:
    """A chat template under which no prompt is a token prefix of the conversation: each
    scenario is handed to the free-running reference with the plan's note, exactly."""
    tokenizer = copy.deepcopy(demo.loaded.tokenizer)
    tokenizer.chat_template = (
        "{% for message in messages %}"
        "{% if message['role'] != 'system' or add_generation_prompt %}"
        "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|> ' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    loaded = dataclasses.replace(demo.loaded, tokenizer=tokenizer)
    subset = demo.scenarios[:2]
    reference = [ReferenceDecoder(loaded, MAX_NEW, history="model").rollout(s) for s in subset]
    fast = FastDecoder(loaded, MAX_NEW, history="model").decode(subset)
    assert_exact(fast, reference)
    assert all(r.notes and "not a token prefix" in r.notes[0] for r in fast)


def test_demo_free_running_starts_as_teacher_forced(demo: DemoCase) -> None:
    forced = ReferenceDecoder(demo.loaded, MAX_NEW)
    left = [
        assert_shares_the_teacher_forced_turns(s, free, forced.rollout(s))
        for s, free in zip(demo.scenarios, demo.reference, strict=True)
    ]
    assert any(left), "no scenario left the truth: the comparison proves nothing"
