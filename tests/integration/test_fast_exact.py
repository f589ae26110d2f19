"""Exact mode (``decode/fast/exact.py``) on the real demo model: the exact stage's logits are the
reference call's bit for bit (batched linears; LoRA's fp32 weights row by row), the decoder's
predictions are the reference path's with the mode on, forced off, and off where the probe
turns it off (fp32 on this CPU; the demo's LoRA, a large share of its tiny model), and the
mode's result survives a JSON round trip with the calibration.

The bf16 cases use the demo's base model without an adapter: peft keeps a LoRA adapter's
weights in fp32 under a bf16 model, and on the 64-wide demo model its r=16 weights are more
than :data:`~pytest_memeval.decode.fast.probe.ROW_BY_ROW_SHARE` of the linear parameters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import (
    Calibration,
    Disagreement,
    ExactMode,
    ExactStage,
    FastDecoder,
    Kind,
    Shared,
    probe_linear_rows,
)
from pytest_memeval.decode.reference import ReferenceDecoder, reference_steps
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.model.prompts import turn_prompts

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

# Real demo-model decodes in bf16 and fp32, about 25 s on 2 cores: not the inner loop.
pytestmark = pytest.mark.slow

MAX_NEW = 16


def _scenarios(n: int) -> list[Scenario]:
    return list(from_records(demo_records("oracle", n), "x").scenarios)


def _outputs(rollouts: Sequence[Rollout]) -> list[list[tuple[str, bool]]]:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


def _reference(loaded: LoadedModel, scenarios: Sequence[Scenario]) -> list[list[tuple[str, bool]]]:
    decoder = ReferenceDecoder(loaded, MAX_NEW)
    return _outputs([decoder.rollout(s) for s in scenarios])


@pytest.fixture(scope="module")
def bf16() -> LoadedModel:
    import torch

    torch.set_num_threads(1)
    return load_model(BASE_MODEL, None, dtype="bfloat16")


@pytest.fixture(scope="module")
def bf16_lora() -> LoadedModel:
    return load_model(BASE_MODEL, ADAPTERS / "oracle", dtype="bfloat16")


def _check_exact_steps(loaded: LoadedModel, probe: ExactMode) -> None:
    """The stage itself, batched (prefill by the reference's own call, then single-token
    steps over per-row caches): every step's logits torch.equal the reference call's. The
    same from the reference calls' own prompt caches (the calibration's check), with no
    prefill of the stage's own."""
    import torch

    prompts = [p.ids for s in _scenarios(3) for p in turn_prompts(loaded.tokenizer, s)]
    references = [reference_steps(loaded, p, MAX_NEW, keep_prompt_cache=True) for p in prompts]
    assert all(r.prompt_cache is not None for r in references)
    stage = ExactStage(Shared.new(loaded, MAX_NEW, FastDecoder(loaded, MAX_NEW).bounds))
    assert stage.unavailable is None
    mode = replace(probe, rows=min(probe.rows, 8))
    turns = stage.decode(prompts, mode, keep_logits=True)
    steps = 0
    for turn, reference in zip(turns, references, strict=True):
        assert list(turn.tokens) == reference.tokens
        assert len(turn.logits) == len(reference.logits)
        for mine, theirs in zip(turn.logits, reference.logits, strict=True):
            assert torch.equal(mine, theirs.cpu())
            steps += 1
    # The steps were batched: far fewer model calls than tokens after the first.
    assert stage.stats.exact_steps < steps - len(prompts)
    assert stage.stats.exact_prefills == len(prompts)
    continued = stage.decode(prompts, mode, keep_logits=True, prefilled=references)
    assert stage.stats.exact_prefills == len(prompts)  # none more
    for again, turn in zip(continued, turns, strict=True):
        assert again.tokens == turn.tokens
        assert all(torch.equal(a, b) for a, b in zip(again.logits, turn.logits, strict=True))


def test_exact_steps_give_the_reference_calls_logits_bit_for_bit(bf16: LoadedModel) -> None:
    """The demo base model in bf16: its 64-wide weights are a rare batch-variant case here
    (about 1 output in 10,000 differs), so they run row by row (allowed for the test; by
    default they are too large a share and the mode is off), the others batched."""
    probe = probe_linear_rows(bf16.model, share=1.0)
    if not probe.on:
        pytest.skip(f"this CPU's bf16 linear kernels are batch-variant: {probe.reason}")
    assert len(probe.shapes) == 5  # the MLP's two, q/k/v fused, the output, lm_head
    assert len(probe.row_by_row) < len(probe.shapes)  # some weights ran batched
    _check_exact_steps(bf16, probe)


def test_lora_weights_batch_variant_in_fp32_run_row_by_row_and_stay_exact(
    bf16_lora: LoadedModel,
) -> None:
    """peft keeps LoRA A and B in fp32 under the bf16 model; fp32 kernels here differ at two
    rows, so those weights run row by row, and the steps are the reference's bit for bit."""
    import torch

    allowed = probe_linear_rows(bf16_lora.model, share=1.0)
    lora = [n for n in allowed.row_by_row if "float32" in n]
    if not lora:
        pytest.skip("this CPU's fp32 kernels are batch-invariant: nothing runs row by row")
    assert allowed.on
    assert all(
        w.dtype == torch.float32 for n, w in bf16_lora.model.named_parameters() if "lora_" in n
    )
    _check_exact_steps(bf16_lora, allowed)


@pytest.mark.parametrize("adapter", [None, "oracle"])
def test_bf16_demo_mode_is_off_says_why_and_predicts_as_the_reference(
    adapter: str | None, bf16: LoadedModel, bf16_lora: LoadedModel
) -> None:
    """By default the demo's row-by-row share (its 64-wide weights, and LoRA's) turns the
    mode off, with the probe's reason; the bounded path decodes, identically."""
    loaded = bf16 if adapter is None else bf16_lora
    scenarios = _scenarios(3)
    decoder = FastDecoder(loaded, MAX_NEW)
    assert _outputs(decoder.decode(scenarios)) == _reference(loaded, scenarios)
    mode = decoder.exact_mode
    if mode.on:  # a CPU whose kernels batch exactly: then checked end to end
        stats = decoder.stats
        assert mode.checked_steps > 0
        assert stats.exact_turns + stats.exact_cached_turns == stats.generated
        return
    assert mode.reason == probe_linear_rows(loaded.model).reason
    assert mode.reason is not None and "may run row by row" in mode.reason
    assert decoder.stats.exact_mode == f"off: {mode.reason}"
    assert decoder.stats.exact_turns == 0


@dataclass(frozen=True)
class Measured:
    """The demo bf16 model's probe (64-wide weights allowed row by row) and calibration,
    measured once for the module's exact-mode tests."""

    probe: ExactMode
    calibration: Calibration


@pytest.fixture(scope="module")
def bf16_measured(bf16: LoadedModel) -> Measured:
    probe = probe_linear_rows(bf16.model, share=1.0)
    if not probe.on:
        pytest.skip(f"this CPU's bf16 linear kernels are batch-variant: {probe.reason}")
    first = FastDecoder(bf16, MAX_NEW)
    first.decode(_scenarios(1))
    assert first.measured is not None
    return Measured(probe, first.measured)


def _mode_on(loaded: LoadedModel, measured: Measured, row_step: Disagreement | None) -> FastDecoder:
    """A decoder using ``measured``'s calibration with exact mode on (the probe's rows) and
    ``row_step`` measured as given (``None``: not measured)."""
    kinds: dict[Kind, Disagreement] = {
        k: d for k, d in measured.calibration.measured.items() if k != "row_step"
    }
    if row_step is not None:
        kinds["row_step"] = row_step
    decoder = FastDecoder(loaded, MAX_NEW)
    decoder.use_calibration(
        replace(
            measured.calibration,
            measured=kinds,
            exact=replace(measured.probe, checked_steps=1),
        )
    )
    assert decoder.exact_mode.on
    return decoder


def test_pending_turns_continue_from_the_forward_cache_and_predict_as_the_reference(
    bf16: LoadedModel, bf16_measured: Measured
) -> None:
    """Exact mode on: every pending turn is first continued in exact steps from the forward
    pass's cache, each decision read with the ``row_step`` bound, and decoded from the
    reference's own prefill where one is a near tie. The predictions are the reference
    path's, and both routes were taken."""
    # ``row_step`` as measured on the demo: 0 ulp everywhere, so the bound is the prior's.
    decoder = _mode_on(bf16, bf16_measured, Disagreement((0.0,), (0.0,)))
    assert decoder.bounds.ulps["row_step"] == 3.0
    scenarios = _scenarios(12)
    assert _outputs(decoder.decode(scenarios)) == _reference(bf16, scenarios)
    stats = decoder.stats
    assert stats.exact_cached_turns > 0 and stats.exact_cached_near_tie > 0
    assert stats.exact_cached_turns + stats.exact_turns == stats.generated
    assert stats.exact_turns == stats.exact_cached_near_tie == stats.exact_prefills
    assert stats.handed_to_reference == 0


def test_without_a_row_step_measurement_pending_turns_are_prefilled(
    bf16: LoadedModel, bf16_measured: Measured
) -> None:
    """A calibration that did not measure ``row_step`` (the kind's bound would be the prior's
    alone) leaves the forward pass's cache unused: every pending turn is prefilled."""
    decoder = _mode_on(bf16, bf16_measured, None)
    scenarios = _scenarios(4)
    assert _outputs(decoder.decode(scenarios)) == _reference(bf16, scenarios)
    assert decoder.stats.exact_cached_turns == decoder.stats.exact_cached_near_tie == 0
    assert decoder.stats.exact_turns == decoder.stats.generated > 0


def test_exact_mode_forced_off_gives_the_same_predictions(bf16: LoadedModel) -> None:
    scenarios = _scenarios(4)
    decoder = FastDecoder(bf16, MAX_NEW, exact=False)
    assert _outputs(decoder.decode(scenarios)) == _reference(bf16, scenarios)
    assert not decoder.exact_mode.on
    assert decoder.stats.exact_mode == "off: turned off (exact=False)"
    assert decoder.stats.exact_turns == decoder.stats.exact_prefills == 0
    assert decoder.measured is not None and decoder.measured.exact is None


def test_fp32_probe_turns_exact_mode_off_on_this_cpu() -> None:
    """fp32 on this CPU: MKL computes one row (gemv) differently from several (gemm), so the
    probe turns exact mode off and the bounded path decodes, with the same predictions."""
    loaded = load_model(BASE_MODEL, ADAPTERS / "oracle", dtype="float32")
    scenarios = _scenarios(3)
    decoder = FastDecoder(loaded, MAX_NEW)
    assert _outputs(decoder.decode(scenarios)) == _reference(loaded, scenarios)
    mode = decoder.exact_mode
    assert decoder.stats.exact_mode == mode.describe()
    if mode.on:  # a CPU whose fp32 kernels are batch-invariant: then checked end to end
        assert mode.checked_steps > 0
        return
    assert mode.rows < 2 and mode.reason is not None
    assert "two rows at once do not give the bits of each row alone" in mode.reason
    assert decoder.stats.exact_turns == 0


def test_exact_mode_round_trips_through_json_with_the_calibration(bf16: LoadedModel) -> None:
    decoder = FastDecoder(bf16, MAX_NEW)
    decoder.decode(_scenarios(2))
    measured = decoder.measured
    assert measured is not None and measured.exact is not None
    again = Calibration.from_dict(json.loads(json.dumps(measured.to_dict())))
    assert again == measured and again.exact == measured.exact
    # Another decoder of the same model and settings takes the mode with the calibration.
    other = FastDecoder(bf16, MAX_NEW)
    other.use_calibration(again)
    assert other.exact_mode == measured.exact
    with pytest.raises(ValueError, match="'rows' and 'checked_steps' must be counts"):
        ExactMode.from_dict({"rows": -1})
