"""Turn prompts for the fast path, with the prefix property proven without re-tokenising
every prompt from scratch.

The fast path needs, for every assistant message ``k`` of a scenario, the token ids of its
prompt (``prompts.scenario_prompts``: the chat template's rendering of ``messages[:k]`` with
the generation prompt, tokenised) and the proof that those ids are a prefix of the whole
conversation's ids. Tokenising every prompt in full costs O(turns x tokens) per scenario, the
largest share of the fast path's own work on a small model. Where the prompt text ends with
a special token (the demo's ``<|assistant|>``, Mistral's ``[/INST]``) and is a *string*
prefix of the conversation text, its ids are provably the conversation's ids up to that
token, with no further tokenisation:

A ``tokenizers`` backend (every transformers "fast" tokenizer) encodes a string in this order
(``tokenizers`` ``TokenizerImpl::encode_single_sequence``): (1) split the raw text on the
added tokens that are not ``normalized``: leftmost-longest, non-overlapping matches, each
match its own piece with the added token's id; (2) normalise, pre-tokenise and run the model
on each remaining piece on its own (a piece's result depends only on its text and its offset
in the input); (3) the post-processor, which with ``add_special_tokens=False`` adds nothing;
truncation and padding when configured. So when

* the backend has no truncation and no padding configured,
* the prompt text ``P`` is a string prefix of the conversation text ``C``,
* in ``C``'s encoding, token ``n - 1`` is an added token that covers exactly
  ``C[s:len(P)]`` (its offsets, with the previous token ending at or before ``s`` and the
  next starting at or after ``len(P)``), ``C[s:len(P)]`` is that token's content, and no
  added token of the tokenizer is ``normalized``, ``single_word``, ``lstrip`` or ``rstrip``
  (whose matching looks at text around the match or after normalisation), and the backend
  does not split special tokens (``encode_special_tokens``: step (1) then skips them),

step (1) cuts ``P`` exactly where it cuts ``C`` up to ``len(P)`` (a leftmost-longest match
in ``C`` that ends by ``len(P)`` is also one in ``P``, and nothing of ``P`` is left after the
last one), every piece before ``len(P)`` has the same text and offset in both, so steps (2)
and (3) give the same ids: ``encode(P) == encode(C)[:n]``. Such a prompt's ids are taken
from the conversation's; any other prompt is tokenised in full and compared as before.

As a guard against a ``tokenizers`` release that encodes differently from the steps above,
the longest prompt of every scenario whose ids the argument gives is tokenised in full too;
if it differs from what the argument gives, every prompt of the scenario is tokenised in
full. (Templates whose prompts end on plain text, e.g. ChatML's ``<|im_start|>assistant\n``,
prove nothing here and are tokenised in full: see docs/decoding.md.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.model.prompts import (
    TurnPrompt,
    encode_many,
    prompt_texts,
    render,
    scenario_prompts,
)

__all__ = ["proven_scenario_prompts"]


def _plain_added_tokens(backend: Any) -> dict[int, str] | None:
    """Added tokens by id when all of them match on the raw text alone (see the module
    docstring), else ``None``."""
    tokens = backend.get_added_tokens_decoder()
    if any(t.normalized or t.single_word or t.lstrip or t.rstrip for t in tokens.values()):
        return None
    return {int(i): str(t.content) for i, t in tokens.items()}


def _boundaries(conversation: str, encoding: Any, added: dict[int, str]) -> dict[int, int]:
    """``{end offset: token count}`` for each added token of ``conversation``'s encoding that
    ends a piece cut by step (1): the prompts whose text ends there need no tokenisation."""
    ids, offsets = encoding.ids, encoding.offsets
    found = {}
    for n, (token, (start, end)) in enumerate(zip(ids, offsets, strict=True)):
        content = added.get(token)
        if (
            content is not None
            and conversation[start:end] == content
            and (n == 0 or offsets[n - 1][1] <= start)
            and (n + 1 == len(ids) or offsets[n + 1][0] >= end)
        ):
            found[end] = n + 1
    return found


def proven_scenario_prompts(
    tokenizer: Any, scenario: Scenario, turns: Sequence[int] | None = None
) -> tuple[list[TurnPrompt], list[int], int]:
    """``prompts.scenario_prompts(tokenizer, scenario)`` plus how many prompts' ids were taken
    from the conversation's by the argument of the module docstring (the others are
    tokenised in full). Same ids as ``scenario_prompts``, by that argument.

    ``turns``: only the prompts of the assistant messages with these numbers (0-based, in
    order), for a caller that needs a few of them (a free-running round); the conversation's
    ids are whole either way."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    added = None
    if (
        backend is not None
        and getattr(tokenizer, "is_fast", False)
        and backend.truncation is None
        and backend.padding is None
        and not getattr(backend, "encode_special_tokens", False)
    ):
        added = _plain_added_tokens(backend)
    numbers = list(range(len(scenario.assistant_indices))) if turns is None else list(turns)
    if backend is None or added is None:
        prompts, full = scenario_prompts(tokenizer, scenario)
        return [prompts[t] for t in numbers], full, 0
    conversation = render(tokenizer, scenario.messages, add_generation_prompt=False)
    texts = prompt_texts(tokenizer, scenario, conversation, numbers)
    encoding = backend.encode(conversation, add_special_tokens=False)
    full = [int(i) for i in encoding.ids]
    ends = _boundaries(conversation, encoding, added)
    ids: list[list[int] | None] = []
    for text in texts:
        n = ends.get(len(text))
        ids.append(full[:n] if n is not None and conversation.startswith(text) else None)
    # The guard: the longest prompt the argument covers is tokenised in full all the same.
    covered = [k for k, i in enumerate(ids) if i is not None]
    guard = covered[-1] if covered else None
    todo = [k for k, i in enumerate(ids) if i is None or k == guard]
    encoded = dict(zip(todo, encode_many(tokenizer, [texts[k] for k in todo]), strict=True))
    if guard is not None and ids[guard] != encoded[guard]:
        prompts, full = scenario_prompts(tokenizer, scenario)
        return [prompts[t] for t in numbers], full, 0
    proven = len(covered) - 1 if covered else 0
    prompts = []
    for n, t in enumerate(numbers):
        k = scenario.assistant_indices[t]
        got = encoded.get(n, ids[n])
        assert got is not None  # every prompt the argument does not cover was encoded
        prompts.append(TurnPrompt(k, tuple(got), scenario.messages[k]["content"]))
    return prompts, full, proven
