"""Prompt rendering: the compiled-template shortcut is exactly apply_chat_template, or unused."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.model import prompts
from pytest_memeval.model.prompts import (
    _encode,
    conversation_ids,
    render,
    scenario_prompts,
    turn_prompts,
)

from ..conftest import BASE_MODEL, demo_records


def _reference_ids(tokenizer: object, scenario: object) -> list[list[int]]:
    return [
        _encode(tokenizer, render(tokenizer, scenario.messages[:k], add_generation_prompt=True))  # type: ignore[attr-defined]
        for k in scenario.assistant_indices  # type: ignore[attr-defined]
    ]


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return AutoTokenizer.from_pretrained(str(BASE_MODEL))


@pytest.mark.parametrize("variant", ["baseline", "oracle"])
def test_every_turn_prompt_equals_apply_chat_template(tokenizer: object, variant: str) -> None:
    assert prompts._PrefixRenderer(tokenizer).compiled is not None  # the shortcut is in use
    bench = from_records(demo_records(variant, 40), variant)
    for scenario in bench.scenarios:
        turns, full = scenario_prompts(tokenizer, scenario)
        assert [list(p.ids) for p in turns] == _reference_ids(tokenizer, scenario), scenario.id
        assert full == conversation_ids(tokenizer, scenario), scenario.id


def test_a_renderer_that_disagrees_is_not_used(
    tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the shortcut ever renders differently, the per-scenario check falls back."""
    scenario = from_records(demo_records("oracle", 1), "x").scenarios[0]
    original = prompts._PrefixRenderer.render

    def drifted(self: prompts._PrefixRenderer, messages: object, add: bool) -> str:
        return original(self, messages, add).replace("<|eot|>", "<|eot|> <|eot|>")  # type: ignore[arg-type]

    monkeypatch.setattr(prompts._PrefixRenderer, "render", drifted)
    got = [list(p.ids) for p in turn_prompts(tokenizer, scenario)]
    assert got == _reference_ids(tokenizer, scenario)
