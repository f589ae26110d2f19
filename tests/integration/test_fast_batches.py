"""Forward passes of the fast path: length-sorted batches of any size, causal sdpa without a
padding mask, all giving the reference path's rollouts (real model, the demo checkpoint)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.compat.attention import attention_implementation
from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.model.prompts import conversation_ids

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

MAX_NEW = 16


@pytest.fixture(scope="module")
def oracle() -> Iterator[LoadedModel]:
    """The demo as ``memeval bench`` runs it: base model, oracle adapter, fp32, eager."""
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


@pytest.fixture(scope="module")
def base_only() -> Iterator[LoadedModel]:
    """No adapter: wrong on many turns, so many turns are generated from the batch's cache."""
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, None)


@pytest.fixture(scope="module")
def scenarios() -> list[Scenario]:
    # The first 11 baseline scenarios: 8 to 38 turns, 100 to 500 tokens.
    return list(from_records(demo_records("baseline", 11), "demo").scenarios)


def _outputs(rollouts: Sequence[Rollout]) -> list[list[tuple[str, bool | None]]]:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


@pytest.fixture(scope="module")
def reference_outputs(
    base_only: LoadedModel, scenarios: list[Scenario]
) -> list[list[tuple[str, bool | None]]]:
    reference = ReferenceDecoder(base_only, MAX_NEW)
    return _outputs([reference.rollout(s) for s in scenarios])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch_size", "forward_attention"), [(3, "auto"), (5, None), (11, "auto")]
)
def test_odd_batches_give_the_reference_rollouts(
    base_only: LoadedModel,
    scenarios: list[Scenario],
    reference_outputs: list[list[tuple[str, bool | None]]],
    batch_size: int,
    forward_attention: str | None,
) -> None:
    fast = FastDecoder(
        base_only, MAX_NEW, batch_size=batch_size, forward_attention=forward_attention
    )
    rollouts = fast.decode(scenarios)
    assert _outputs(rollouts) == reference_outputs
    assert fast.stats.generated > 0 and fast.stats.teacher_forced > 0
    # 11 scenarios in batches of at most batch_size rows (and padding at most a tenth of a
    # pass: FORWARD_MIN_FILL), every row counted in exactly one of them.
    groups = fast.batch_groups([len(conversation_ids(base_only.tokenizer, s)) for s in scenarios])
    assert sorted(len(g) for g in groups) != [1] * len(scenarios)  # some passes are batched
    assert max(len(g) for g in groups) <= batch_size
    sizes = sorted(r.batch for r in rollouts)
    assert sizes == sorted(len(g) for g in groups for _ in g)
    assert sum(1 / b for b in sizes) == pytest.approx(len(groups))
    # The calibration saw this forward pass and stayed far from the bound.
    assert max(fast.bounds.disagreement("first").absolute) < fast.bounds.absolute["first"] / 10


@pytest.mark.slow
def test_forward_passes_run_causal_sdpa_and_generate_keeps_the_models_attention(
    oracle: LoadedModel, scenarios: list[Scenario]
) -> None:
    fast = FastDecoder(oracle, MAX_NEW, batch_size=4)
    assert fast.forward_attention == "sdpa"  # the demo is loaded with eager attention
    assert FastDecoder(oracle, MAX_NEW, forward_attention=None).forward_attention is None
    seen: list[str | None] = []
    model = oracle.model.get_base_model()
    hook = model.gpt_neox.layers[0].attention.register_forward_hook(
        lambda module, args, out: seen.append(module.config._attn_implementation)
    )
    try:
        rollouts = fast.decode(scenarios[:6])
    finally:
        hook.remove()
    reference = ReferenceDecoder(oracle, MAX_NEW)
    assert _outputs(rollouts) == _outputs([reference.rollout(s) for s in scenarios[:6]])
    # The forward passes (6 scenarios, batch 4, padding at most a tenth) in sdpa; everything
    # else (generate, the calibration's reference calls) in the model's own eager attention,
    # restored after.
    passes = fast.batch_groups([len(conversation_ids(oracle.tokenizer, s)) for s in scenarios[:6]])
    assert 2 <= len(passes) < 6
    assert seen.count("sdpa") == len(passes)
    assert "eager" in seen
    assert attention_implementation(oracle.model) == "eager"


@pytest.mark.slow
def test_a_16_bit_model_keeps_its_attention_in_the_forward_pass() -> None:
    bf16 = load_model(BASE_MODEL, ADAPTERS / "oracle", dtype="bfloat16")
    assert FastDecoder(bf16, MAX_NEW).forward_attention is None


@pytest.mark.slow
def test_a_16_bit_model_on_the_cpu_forwards_one_scenario_a_pass(
    oracle: LoadedModel, scenarios: list[Scenario]
) -> None:
    """On the CPU a 16-bit pass holds one scenario (longest first), an fp32 pass several;
    either way the bf16 rollouts are the reference's."""
    bf16 = load_model(BASE_MODEL, ADAPTERS / "oracle", dtype="bfloat16")
    lengths = [len(conversation_ids(bf16.tokenizer, s)) for s in scenarios]
    fast = FastDecoder(bf16, MAX_NEW, batch_size=8)
    groups = fast.batch_groups(lengths)
    assert [len(g) for g in groups] == [1] * len(scenarios)
    assert [lengths[g[0]] for g in groups] == sorted(lengths, reverse=True)
    assert max(len(g) for g in FastDecoder(oracle, MAX_NEW, batch_size=8).batch_groups(lengths)) > 1
    subset = scenarios[:4]
    rollouts = fast.decode(subset)
    assert [r.batch for r in rollouts] == [1] * len(subset)
    # What a pass may hold here (the summary's "of B"): 1, whatever batch_size says.
    assert [r.batch_size for r in rollouts] == [1] * len(subset) and fast.rows_per_pass == 1
    assert FastDecoder(oracle, MAX_NEW, batch_size=8).rows_per_pass == 8
    reference = ReferenceDecoder(bf16, MAX_NEW)
    assert _outputs(rollouts) == _outputs([reference.rollout(s) for s in subset])


def test_no_padding_mask_leaves_every_real_positions_logits_bit_for_bit(
    oracle: LoadedModel, scenarios: list[Scenario]
) -> None:
    """The argument for dropping the padding mask: right padding under causal attention, so
    a real position never sees padding; with eager attention the logits are the same bits."""
    import torch

    rows = [conversation_ids(oracle.tokenizer, s) for s in scenarios[:3]]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), oracle.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for n, row in enumerate(rows):
        ids[n, : len(row)] = torch.tensor(row)
        mask[n, : len(row)] = 1
    assert int(mask.sum()) < mask.numel()  # some padding to hide
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.inference_mode():
        masked = oracle.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        unmasked = oracle.model(input_ids=ids, position_ids=positions).logits
    for n, row in enumerate(rows):
        assert torch.equal(masked[n, : len(row)], unmasked[n, : len(row)])
