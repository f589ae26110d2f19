"""A real model acting in TextWorld Express: the policy keeps the prompt contract, each step is
the reference call a careful transformers user would write, and a run is deterministic."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_memeval.decode.policy import ModelPolicy, model_context
from pytest_memeval.env import Episode, TerminationReason, TextWorldExpress, make_env, run_episode
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL
from ..envs import require_textworld, twc_spec

# The demo model acting in TextWorld Express JVMs: not the inner loop.
pytestmark = pytest.mark.slow

MAX_NEW = 8
STEPS = 3


@pytest.fixture(scope="module")
def oracle() -> LoadedModel:
    import torch

    torch.set_num_threads(1)
    return load_model(BASE_MODEL, ADAPTERS / "oracle")


@pytest.fixture(scope="module")
def twx() -> Iterator[TextWorldExpress]:
    require_textworld()
    env = make_env(twc_spec())
    assert isinstance(env, TextWorldExpress)
    yield env
    env.close()


def _plain_transformers_action(loaded: LoadedModel, messages: list[dict[str, str]]) -> str:
    """What a transformers user writes for one action: template, greedy generate, decode."""
    import torch

    tok, model = loaded.tokenizer, loaded.model
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=list(loaded.stop_ids),
            pad_token_id=loaded.pad_id,
        )
    return str(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)).strip()


def _episodes(env: TextWorldExpress, loaded: LoadedModel, **policy: Any) -> list[Episode]:
    return [
        run_episode(env, seed, ModelPolicy(loaded, MAX_NEW, **policy), max_steps=STEPS)
        for seed in (0, 1)
    ]


def test_each_action_is_the_plain_greedy_call_on_the_conversation_so_far(
    twx: TextWorldExpress, oracle: LoadedModel
) -> None:
    (episode, _) = _episodes(twx, oracle)
    assert episode.reason is TerminationReason.STEP_LIMIT and len(episode.steps) == STEPS
    messages = [dict(m) for m in episode.messages]
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * STEPS + ["user"]
    for k, step in enumerate(episode.steps):
        assert step.action == _plain_transformers_action(oracle, messages[: 2 + 2 * k])
        assert messages[2 + 2 * k]["content"] == step.action
        assert messages[3 + 2 * k]["content"] == step.observation.strip()


def test_two_runs_give_identical_trajectories(twx: TextWorldExpress, oracle: LoadedModel) -> None:
    first, again = _episodes(twx, oracle), _episodes(twx, oracle)
    assert first == again
    assert first[0].actions != first[1].actions or first[0].observation != first[1].observation


def test_a_prompt_past_the_context_is_a_context_limit(
    twx: TextWorldExpress, oracle: LoadedModel
) -> None:
    assert model_context(oracle) == 2048
    policy = ModelPolicy(oracle, MAX_NEW)
    observation, info = twx.reset(0)
    first = len(
        policy.prompt_ids(
            [
                {"role": "system", "content": info.task_description or ""},
                {"role": "user", "content": observation.strip()},
            ]
        )
    )
    fits = _episodes(twx, oracle, context_limit=first + MAX_NEW)[0]
    assert fits.reason is TerminationReason.CONTEXT_LIMIT and len(fits.steps) == 1
    none = _episodes(twx, oracle, context_limit=first + MAX_NEW - 1)[0]
    assert none.reason is TerminationReason.CONTEXT_LIMIT and none.steps == ()


def test_an_output_cut_at_the_token_limit_is_sent_as_it_is_and_flagged(
    twx: TextWorldExpress, oracle: LoadedModel
) -> None:
    policy = ModelPolicy(oracle, 1)  # one token: less than any action of this model
    episode = run_episode(twx, 0, policy, max_steps=STEPS)
    full = run_episode(twx, 0, ModelPolicy(oracle, MAX_NEW), max_steps=1)
    assert episode.steps[0].truncated_output and not full.steps[0].truncated_output
    assert full.steps[0].action.startswith(episode.steps[0].action)
    assert len(episode.steps[0].action) < len(full.steps[0].action)
