"""The fast path with the prefix proof of ``model/prefix.py``: where a prompt is not proven
(it does not end on an added token) it is tokenised, and where it is then not a token prefix
the scenario goes to the reference path, with the same outputs (real model)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.decode.fast import FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

MAX_NEW = 16


@pytest.mark.slow
def test_unproven_prompt_that_is_no_token_prefix_goes_to_the_reference_path() -> None:
    import torch

    torch.set_num_threads(1)
    loaded = load_model(BASE_MODEL, ADAPTERS / "oracle")
    tokenizer = copy.deepcopy(loaded.tokenizer)
    # The generation prompt ends inside the answer's first word: a string prefix of the
    # conversation text, but its last token ('pi', unknown) is not the conversation's.
    tokenizer.chat_template = (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|> ' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|> pi' }}{% endif %}"
    )
    loaded = dataclasses.replace(loaded, tokenizer=tokenizer)
    records = [r for r in demo_records("oracle", 20) if "pick" in r["messages"][2]["content"]]
    scenarios = list(from_records(records[:2], "mid-word").scenarios)
    fast = FastDecoder(loaded, MAX_NEW)
    rollouts = fast.decode(scenarios)
    assert fast.stats.prompts_proven == 0
    assert fast.stats.reference_scenarios == len(scenarios)
    reference = ReferenceDecoder(loaded, MAX_NEW)
    for scenario, rollout in zip(scenarios, rollouts, strict=True):
        assert rollout.notes and "not a token prefix" in rollout.notes[0]
        expected = reference.rollout(scenario)
        assert [(o.text, o.stopped) for o in rollout.outputs] == [
            (o.text, o.stopped) for o in expected.outputs
        ]


@pytest.mark.slow
def test_proven_prompts_decode_as_the_reference_does() -> None:
    """On the demo template every prompt but each scenario's last is proven, and the fast
    path's outputs are the reference path's."""
    import torch

    torch.set_num_threads(1)
    loaded = load_model(BASE_MODEL, ADAPTERS / "oracle")
    scenarios = list(from_records(demo_records("oracle", 6), "demo").scenarios)
    fast = FastDecoder(loaded, MAX_NEW, batch_size=3)
    rollouts = fast.decode(scenarios)
    turns = sum(len(s.assistant_indices) for s in scenarios)
    assert fast.stats.prompts_proven == turns - len(scenarios)
    reference = ReferenceDecoder(loaded, MAX_NEW)
    for scenario, rollout in zip(scenarios, rollouts, strict=True):
        assert not rollout.notes
        assert [(o.text, o.stopped) for o in rollout.outputs] == [
            (o.text, o.stopped) for o in reference.rollout(scenario).outputs
        ]
