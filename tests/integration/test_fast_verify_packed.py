"""Packed verification passes: the pending turns of one conversation verified in one row of
one forward pass over the forward pass's cache as it is (a 4D mask per turn, no cut caches)
compute what the model computes for each turn alone, and decode exactly as the reference
path does, also where ``generate`` continues from a draft a packed pass made longer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import CacheSlice, Continuation, FastDecoder
from pytest_memeval.decode.fast import verify as verify_stage
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.model.prefix import proven_scenario_prompts

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

MAX_NEW = 16


@pytest.fixture(scope="module")
def demo() -> Iterator[LoadedModel]:
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


def _demo(n: int) -> list[Scenario]:
    return list(from_records(demo_records("oracle", n), "demo").scenarios)


def _outputs(rollouts: Sequence[Rollout]) -> list[list[tuple[str, bool | None]]]:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


def test_turns_packed_in_one_row_see_only_their_own_prompt(demo: LoadedModel) -> None:
    """Four turns of one conversation, each fed its prompt's last token and three more,
    packed in one row over the conversation's cache: each turn's logits are the model's
    for that turn's prompt and tokens alone (no cache, no other turn)."""
    import torch

    scenario = _demo(1)[0]
    prompts, full, _ = proven_scenario_prompts(demo.tokenizer, scenario)
    assert len(prompts) >= 4
    with torch.inference_mode():
        cache = demo.model(input_ids=torch.tensor([list(full)]), use_cache=True).past_key_values
    fast = FastDecoder(demo, MAX_NEW)
    rows = []
    for prompt in prompts[:4]:
        ids = list(prompt.ids)
        # tokens after the prompt that are NOT the conversation's (the cache holds those)
        rows.append(Continuation(CacheSlice(cache, 0, 0, len(ids) - 1), (ids[-1], 7, 8, 9)))
    packed = fast.verifier.packed_pass(rows)
    assert packed is not None and fast.stats.verify_packed_passes == 1
    for n, row in enumerate(rows):
        got = packed.logits_of(n)
        alone = [*full[: row.context.length], *row.tokens]
        with torch.inference_mode():
            logits = demo.model(input_ids=torch.tensor([alone])).logits
        want = logits[0, -len(row.tokens) :].float()
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    # The forward pass's cache is untouched (later turns still read it).
    assert cache.layers[0].keys.shape[-2] == len(full)


def test_one_row_with_segment_attention_computes_what_padded_rows_compute(
    demo: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packed pass in one row (segment attention over each conversation's cache row, no
    padding, no copy) against the padded rows over a copied cache (the computation where
    the attention cannot be switched), and against the model's own attention function per
    group (where a layer's attention is not the plain formula): the same logits, within
    float32 noise, the same argmax; the source cache untouched."""
    import torch

    from pytest_memeval.compat import segment_attention as segments

    conversations = [proven_scenario_prompts(demo.tokenizer, s)[:2] for s in _demo(3)]
    width = max(len(full) for _, full in conversations)
    ids = torch.full((len(conversations), width), demo.pad_id, dtype=torch.long)
    for row, (_, full) in enumerate(conversations):
        ids[row, : len(full)] = torch.tensor(list(full))
    with torch.inference_mode():
        cache = demo.model(input_ids=ids, use_cache=True).past_key_values
    rows = [
        Continuation(CacheSlice(cache, row, 0, len(p.ids) - 1), (p.ids[-1], 7, 8, 9)[: 2 + n % 3])
        for row, (prompts, _) in enumerate(conversations)
        for n, p in enumerate(prompts[: 2 + row * 2])
    ]
    one_row = FastDecoder(demo, MAX_NEW).verifier
    assert one_row.segments_unavailable is None
    flat = one_row.packed_pass(rows)
    padded = FastDecoder(demo, MAX_NEW).verifier
    monkeypatch.setattr(padded, "segments_unavailable", "forced off for the comparison")
    by_rows = padded.packed_pass(rows)
    monkeypatch.setattr(segments, "_plain", lambda kwargs: False)
    own = one_row.packed_pass(rows)
    assert flat is not None and by_rows is not None and own is not None
    assert flat.logits.shape[0] == 1 and by_rows.logits.shape[0] == len(conversations)
    for n in range(len(rows)):
        want = by_rows.logits_of(n)
        for got in (flat.logits_of(n), own.logits_of(n)):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert cache.layers[0].keys.shape[-2] == width


@pytest.mark.slow
def test_one_scenario_per_pass_many_turns_per_row_equal_the_reference(
    demo: LoadedModel,
) -> None:
    scenarios = _demo(4)
    fast = FastDecoder(demo, MAX_NEW, batch_size=1)
    assert _outputs(fast.decode(scenarios)) == _outputs(
        [ReferenceDecoder(demo, MAX_NEW).rollout(s) for s in scenarios]
    )
    assert fast.stats.verify_packed_passes > 0
    # several pending turns of one conversation shared a packed row
    assert fast.stats.verified > fast.stats.verify_packed_passes


@pytest.mark.slow
def test_generate_continues_from_a_draft_a_packed_pass_grew(
    demo: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round only: drafts the packed pass made longer go to ``generate``, which
    continues them from a cache a cut pass filled in."""
    monkeypatch.setattr(verify_stage, "VERIFY_ROUNDS", 1)
    scenarios = _demo(6)
    fast = FastDecoder(demo, MAX_NEW)
    assert _outputs(fast.decode(scenarios)) == _outputs(
        [ReferenceDecoder(demo, MAX_NEW).rollout(s) for s in scenarios]
    )
    assert fast.stats.generate_grown_drafts > 0, fast.stats
    assert fast.stats.generated_without_cache == 0
