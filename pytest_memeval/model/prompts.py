"""Prompts: scenario messages rendered with the tokenizer's chat template, as token ids.

Teacher-forced (``--memeval-history truth``), every assistant message is predicted from the
true history before it, so the prompt of assistant message ``k`` is ``messages[:k]`` rendered
with ``add_generation_prompt=True``. Free-running (``--memeval-history model``), the same
rendering of the same messages, except that every earlier assistant message holds the model's
own output for it (:func:`with_history`, :func:`free_running_prompt`). Both decode paths and
the token guards take their ids from here, so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_memeval.compat.transformers import compile_chat_template
from pytest_memeval.core.benchmark import Scenario

__all__ = [
    "TurnPrompt",
    "conversation_ids",
    "encode_many",
    "free_running_prompt",
    "history_scenario",
    "prompt_texts",
    "render",
    "scenario_prompts",
    "turn_prompts",
    "with_history",
]


def render(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool
) -> str:
    """The chat-template text of ``messages``."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert isinstance(text, str)
    return text


def _encode(tokenizer: Any, text: str) -> list[int]:
    # The template already carries every special token; adding BOS again is the classic
    # doubled-BOS drift between training and evaluation prompts.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


@dataclass(frozen=True)
class TurnPrompt:
    """The prompt of one assistant message: its index in ``messages`` and its token ids."""

    message_index: int
    ids: tuple[int, ...]
    target: str


def encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``_encode`` of each text. A fast tokenizer's ``__call__`` on a batch is exactly one
    ``encode_batch`` of its Rust backend (plus Python-side padding/truncation, unused here);
    calling the backend directly skips that per-call overhead, which dominates for the
    O(turns^2) tokens of teacher-forced prompts.

    Only while the backend has no padding or truncation of its own: a ``tokenizer.json`` may
    carry either, and the backend applies it (``__call__`` clears it first), which would pad
    or cut every prompt, and differently depending on whether the tokenizer was called
    before."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is None
        or not getattr(tokenizer, "is_fast", False)
        or backend.padding is not None
        or backend.truncation is not None
    ):
        return [_encode(tokenizer, t) for t in texts]
    return [[int(i) for i in e.ids] for e in backend.encode_batch(texts, add_special_tokens=False)]


class _PrefixRenderer:
    """Renders many prefixes of one conversation with the tokenizer's compiled template.

    ``apply_chat_template`` re-normalises every message on every call (a deep copy into plain
    JSON types), which makes rendering all turn prompts O(turns^2) in Python work and, on a
    small model, the largest cost of the fast path. Scenario messages are already plain
    ``{"role": str, "content": str}`` dicts, for which that normalisation is the identity, so
    the compiled template is called with exactly the arguments ``apply_chat_template`` passes
    (messages, ``tools=None``, ``documents=None``, ``add_generation_prompt``, the special
    tokens map). Each scenario is still checked against ``apply_chat_template`` itself (the
    whole conversation and the final prompt); any difference, a non-string template, or a
    transformers without the compiled-template helper (``compat.transformers``) falls back to
    ``apply_chat_template`` for every prompt.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.compiled: Any = None
        self.kwargs: dict[str, Any] = {}
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str):
            return
        self.compiled = compile_chat_template(template)
        if self.compiled is None:  # a transformers without it: apply_chat_template throughout
            return
        self.kwargs = dict(tokenizer.special_tokens_map)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        text = self.compiled.render(
            messages=[{"role": m["role"], "content": m["content"]} for m in messages],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.kwargs,
        )
        return str(text)


def prompt_texts(
    tokenizer: Any, scenario: Scenario, conversation: str, turns: Sequence[int] | None = None
) -> list[str]:
    """The text of every turn prompt (or of the assistant messages numbered ``turns``, in
    that order: a free-running round needs only the next few); ``conversation`` is
    ``apply_chat_template``'s rendering of the whole scenario, the reference the shortcut is
    checked against."""
    every = scenario.assistant_indices
    ks = every if turns is None else [every[t] for t in turns]
    renderer = _PrefixRenderer(tokenizer)  # cheap: transformers caches the compiled template
    if renderer.compiled is not None and ks:
        texts = [renderer.render(scenario.messages[:k], True) for k in ks]
        # The check that keeps this exact: the same text as apply_chat_template, here.
        if renderer.render(scenario.messages, False) == conversation and texts[-1] == render(
            tokenizer, scenario.messages[: ks[-1]], add_generation_prompt=True
        ):
            return texts
    return [render(tokenizer, scenario.messages[:k], add_generation_prompt=True) for k in ks]


def scenario_prompts(tokenizer: Any, scenario: Scenario) -> tuple[list[TurnPrompt], list[int]]:
    """Every turn prompt and the whole conversation's ids, rendering the conversation once."""
    conversation = render(tokenizer, scenario.messages, add_generation_prompt=False)
    ks = scenario.assistant_indices
    texts = [*prompt_texts(tokenizer, scenario, conversation), conversation]
    *ids, full = encode_many(tokenizer, texts)
    prompts = [
        TurnPrompt(k, tuple(i), scenario.messages[k]["content"])
        for k, i in zip(ks, ids, strict=True)
    ]
    return prompts, full


def turn_prompts(tokenizer: Any, scenario: Scenario) -> list[TurnPrompt]:
    """One prompt per assistant message, in order (the last one is the final query's)."""
    return scenario_prompts(tokenizer, scenario)[0]


def with_history(
    scenario: Scenario, outputs: Sequence[str], upto: int | None = None
) -> list[dict[str, str]]:
    """The scenario's messages with its first ``len(outputs)`` assistant messages replaced by
    ``outputs`` (already as they are fed back: ``history.fed_back``), every other message as
    the benchmark has it; cut before message ``upto`` when given."""
    messages = [{"role": m["role"], "content": m["content"]} for m in scenario.messages]
    for k, text in zip(scenario.assistant_indices, outputs, strict=False):
        messages[k]["content"] = text
    return messages if upto is None else messages[:upto]


def history_scenario(
    scenario: Scenario, outputs: Sequence[str], through: int | None = None
) -> Scenario:
    """``scenario`` with its first ``len(outputs)`` assistant messages replaced by
    ``outputs`` (:func:`with_history`): the conversation as the model has made it so far,
    the truth after it, ending with assistant message number ``through`` (0-based; ``None``:
    the whole conversation). Every free-running prompt of the turns that follow ``outputs``
    (up to ``through``) is this scenario's teacher-forced prompt of that turn."""
    upto = None if through is None else scenario.assistant_indices[through] + 1
    messages = with_history(scenario, outputs, upto)
    return dataclasses.replace(scenario, messages=tuple(messages))


def free_running_prompt(
    tokenizer: Any, scenario: Scenario, outputs: Sequence[str], turn: int
) -> TurnPrompt:
    """The free-running prompt of assistant message number ``turn`` (0-based): the chat
    template's rendering of the messages before it with ``add_generation_prompt=True``,
    the earlier assistant messages being ``outputs[:turn]`` (exactly as
    ``apply_chat_template`` renders a teacher-forced prompt, and the same text as that
    prompt whenever every earlier output is the truth)."""
    k = scenario.assistant_indices[turn]
    messages = with_history(scenario, outputs[:turn], upto=k)
    ids = _encode(tokenizer, render(tokenizer, messages, add_generation_prompt=True))
    return TurnPrompt(k, tuple(ids), scenario.messages[k]["content"])


def conversation_ids(tokenizer: Any, scenario: Scenario) -> list[int]:
    """Token ids of the whole conversation, as the training format renders it."""
    return _encode(tokenizer, render(tokenizer, scenario.messages, add_generation_prompt=False))
