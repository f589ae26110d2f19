"""The fast path's prompts: ids proven to be the conversation's prefix without tokenising them
are exactly what tokenising each prompt gives, and the proof is not used where it does not
hold (tokenizer only, no model run)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tokenizers import AddedToken
from transformers import AutoTokenizer

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.model import prefix
from pytest_memeval.model.prefix import proven_scenario_prompts
from pytest_memeval.model.prompts import (
    _encode,
    free_running_prompt,
    history_scenario,
    render,
    scenario_prompts,
)

from ..conftest import BASE_MODEL, demo_records


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(BASE_MODEL))


def _tokenised(tokenizer: Any, scenario: Any) -> list[list[int]]:
    """Every turn prompt rendered by apply_chat_template and tokenised in full."""
    return [
        _encode(tokenizer, render(tokenizer, scenario.messages[:k], add_generation_prompt=True))
        for k in scenario.assistant_indices
    ]


@pytest.mark.parametrize("variant", ["baseline", "oracle"])
def test_proven_ids_are_the_tokenised_prompts(tokenizer: Any, variant: str) -> None:
    for scenario in from_records(demo_records(variant, 30), variant).scenarios:
        prompts, full, proven = proven_scenario_prompts(tokenizer, scenario)
        assert [list(p.ids) for p in prompts] == _tokenised(tokenizer, scenario), scenario.id
        assert (prompts, full) == scenario_prompts(tokenizer, scenario)
        # The demo template's prompts end with <|assistant|>: all but the last (tokenised
        # in full as the guard) are proven.
        assert proven == len(prompts) - 1


def test_some_turns_only_and_the_free_running_prompts(tokenizer: Any) -> None:
    """A free-running round asks for the prompts of a few turns: the same ids as all of
    them give; and the conversation as the model made it so far (``history_scenario``) has
    the free-running prompt of each later turn as its teacher-forced prompt."""
    scenario = from_records(demo_records("oracle", 1), "oracle").scenarios[0]
    every, full, _ = proven_scenario_prompts(tokenizer, scenario)
    some, same_full, _ = proven_scenario_prompts(tokenizer, scenario, [2, 3, 5])
    assert some == [every[2], every[3], every[5]] and same_full == full
    outputs = ["pick cup from table", "close fridge"]
    variant = history_scenario(scenario, outputs)
    later, _, _ = proven_scenario_prompts(tokenizer, variant, [2, 3])
    for turn, prompt in zip((2, 3), later, strict=True):
        assert prompt == free_running_prompt(tokenizer, scenario, outputs, turn)
    assert free_running_prompt(tokenizer, scenario, [], 0) == every[0]
    assert later[0] != every[2]  # the history differs: so do the prompts
    # Cut after the turn a round needs last: the same prompts, a shorter conversation.
    short = history_scenario(scenario, outputs, through=3)
    assert proven_scenario_prompts(tokenizer, short, [2, 3])[0] == later
    assert len(short.assistant_indices) == 4 and short.messages[-1]["role"] == "assistant"


def test_a_prompt_not_ending_on_an_added_token_is_tokenised(tokenizer: Any) -> None:
    """A generation prompt that ends inside a word ('pi' of 'pick'): a string prefix of the
    conversation, but not a token prefix. The argument does not apply; the prompt is
    tokenised in full, so the fast path's own check sees that it is not a prefix."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|> ' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|> pi' }}{% endif %}"
    )
    records = [
        {
            "id": "mid-word",
            "messages": [
                {"role": "user", "content": "mug to sink"},
                {"role": "assistant", "content": "pick mug from table"},
            ],
        }
    ]
    scenario = from_records(records, "x").scenarios[0]
    prompts, full, proven = proven_scenario_prompts(tok, scenario)
    assert proven == 0
    assert [list(p.ids) for p in prompts] == _tokenised(tok, scenario)
    assert list(full[: len(prompts[0].ids)]) != list(prompts[0].ids)


def test_added_tokens_that_match_by_context_turn_the_argument_off(tokenizer: Any) -> None:
    """An added token with rstrip (its match takes the whitespace after it) is outside the
    argument: every prompt is tokenised in full."""
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens([AddedToken("<|tool|>", rstrip=True)])
    assert prefix._plain_added_tokens(tok.backend_tokenizer) is None
    scenario = from_records(demo_records("oracle", 1), "x").scenarios[0]
    prompts, _, proven = proven_scenario_prompts(tok, scenario)
    assert proven == 0
    assert [list(p.ids) for p in prompts] == _tokenised(tok, scenario)


def test_the_guard_catches_a_wrong_argument(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the argument ever gave ids other than the tokenizer's (here: boundaries one token
    short), the last prompt, always tokenised in full, disagrees and every prompt of the
    scenario is tokenised."""
    real = prefix._boundaries

    def off_by_one(conversation: str, encoding: Any, added: dict[int, str]) -> dict[int, int]:
        return {end: n - 1 for end, n in real(conversation, encoding, added).items()}

    monkeypatch.setattr(prefix, "_boundaries", off_by_one)
    scenario = from_records(demo_records("oracle", 1), "x").scenarios[0]
    prompts, _, proven = proven_scenario_prompts(tokenizer, scenario)
    assert proven == 0
    assert [list(p.ids) for p in prompts] == _tokenised(tokenizer, scenario)


def test_non_ascii_text_keeps_offsets_in_characters(tokenizer: Any) -> None:
    """Offsets are compared with ``len(prompt text)``: they must count characters, not bytes
    (multi-byte text before a boundary would otherwise shift every later proof)."""
    records = [
        {
            "id": "ünïcødé",
            "messages": [
                {"role": "system", "content": "objets : œuf table , 🍎 counter"},
                {"role": "user", "content": "œuf → sink"},
                {"role": "assistant", "content": "pick œuf from table"},
                {"role": "user", "content": "🍎 to sink"},
                {"role": "assistant", "content": "pick 🍎 from counter"},
                {"role": "user", "content": "ok"},
                {"role": "assistant", "content": "place 🍎 in sink"},
            ],
        }
    ]
    scenario = from_records(records, "x").scenarios[0]
    prompts, full, proven = proven_scenario_prompts(tokenizer, scenario)
    assert proven == 2
    assert [list(p.ids) for p in prompts] == _tokenised(tokenizer, scenario)
    assert (prompts, full) == scenario_prompts(tokenizer, scenario)
