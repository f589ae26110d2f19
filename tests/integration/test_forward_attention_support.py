"""The forward pass switches to sdpa only where the architecture has it: Gemma-2 has none, so
its forward passes keep the model's eager attention (and the predictions stay the reference's,
see test_families); GPT-NeoX (the demo) switches."""

from __future__ import annotations

import pytest

from pytest_memeval.compat.attention import attention_implementation, can_switch_attention
from pytest_memeval.decode.fast import FastDecoder
from pytest_memeval.model.loading import load_model

from ..conftest import BASE_MODEL
from ..families import CHECKPOINTS


@pytest.mark.parametrize(("model", "expected"), [("gemma", None), ("demo", "sdpa")])
def test_sdpa_forward_only_where_the_architecture_supports_it(
    model: str, expected: str | None
) -> None:
    loaded = load_model(BASE_MODEL if model == "demo" else CHECKPOINTS / model, None)
    assert attention_implementation(loaded.model) == "eager"
    assert can_switch_attention(loaded.model, "sdpa") is (expected == "sdpa")
    # The trial switch leaves the model as it was.
    assert attention_implementation(loaded.model) == "eager"
    assert FastDecoder(loaded, 8).forward_attention == expected
