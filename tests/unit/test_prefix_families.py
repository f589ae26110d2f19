"""Proven prompt ids on the family tokenizers (byte-level BPE, sentencepiece-style, each
family's own template), with awkward message text; and the backend shortcut of
``encode_many`` never applies padding or truncation a ``tokenizer.json`` carries
(tokenizers only, no model run)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from transformers import AutoTokenizer

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.model.prefix import proven_scenario_prompts
from pytest_memeval.model.prompts import _encode, encode_many, render, scenario_prompts

from ..conftest import BASE_MODEL, demo_records
from ..families import CHECKPOINTS, FAMILIES, family_records

#: message text that tries the argument's edges: special-token text inside a message,
#: non-ASCII (offsets are characters), a combining mark right after a message boundary,
#: ligatures a normaliser would change, and whitespace-only content
AWKWARD = [
    "put the café mug [/INST] on the <|assistant|> shelf </s>",
    "\u0301then the next one \U0001f600",
    "ﬁnd the ﬂask",
    "   ",
]


def _awkward(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    for r in out:
        r["id"] = f"awkward-{r['id']}"
        users = [m for m in r["messages"] if m["role"] == "user"]
        for m, extra in zip(users, AWKWARD, strict=False):
            m["content"] = extra + m["content"] if extra.strip() else m["content"] + extra
    return out


def _tokenised(tokenizer: Any, scenario: Any) -> list[list[int]]:
    return [
        _encode(tokenizer, render(tokenizer, scenario.messages[:k], add_generation_prompt=True))
        for k in scenario.assistant_indices
    ]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_proven_ids_are_the_tokenised_prompts_for_every_family(name: str) -> None:
    family = FAMILIES[name]
    tokenizer = AutoTokenizer.from_pretrained(str(CHECKPOINTS / name))
    records = family_records(family, "oracle", "val", 6)
    scenarios = from_records([*records, *_awkward(records)[:3]], name).scenarios
    proven_total = 0
    for scenario in scenarios:
        prompts, full, proven = proven_scenario_prompts(tokenizer, scenario)
        assert [list(p.ids) for p in prompts] == _tokenised(tokenizer, scenario), scenario.id
        assert (prompts, full) == scenario_prompts(tokenizer, scenario)
        proven_total += proven
    # Mistral's prompts end on [/INST], an added token: the argument covers them. The other
    # families' prompts end on plain text (ChatML's "assistant\n", a header's "\n\n"...).
    if name == "mistral":
        assert proven_total > 0
    else:
        assert proven_total == 0


@pytest.mark.parametrize("setting", ["padding", "truncation"])
def test_encode_many_ignores_padding_and_truncation_saved_in_the_tokenizer(
    setting: str,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(BASE_MODEL))
    scenario = from_records(demo_records("oracle", 1), "x").scenarios[0]
    texts = [
        render(tokenizer, scenario.messages[:k], add_generation_prompt=True)
        for k in scenario.assistant_indices
    ]
    expected = [_encode(tokenizer, t) for t in texts]
    assert len({len(e) for e in expected}) > 1  # prompts of different lengths
    backend = tokenizer.backend_tokenizer

    def configure() -> None:
        # Set again before each call: a tokenizer __call__ (as _encode does) clears it.
        if setting == "padding":
            backend.enable_padding(length=max(len(e) for e in expected) + 5)
        else:
            backend.enable_truncation(max_length=min(len(e) for e in expected))

    configure()
    assert encode_many(tokenizer, texts) == expected
    # The fast path's prompts (the proven argument is off with such a backend) agree.
    configure()
    prompts, _, proven = proven_scenario_prompts(tokenizer, scenario)
    assert proven == 0
    assert [list(p.ids) for p in prompts] == expected
