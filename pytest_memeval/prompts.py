"""Prompts: scenario messages rendered with the tokenizer's chat template, as token ids.

Every assistant message is predicted from the teacher-forced history before it, so the prompt
of assistant message ``k`` is ``messages[:k]`` rendered with ``add_generation_prompt=True``.
Both decode paths and the token guards take their ids from here, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .benchmark import Scenario

__all__ = ["TurnPrompt", "conversation_ids", "render", "turn_prompts"]


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


def _encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``_encode`` of each text. A fast tokenizer's ``__call__`` on a batch is exactly one
    ``encode_batch`` of its Rust backend (plus Python-side padding/truncation, unused here);
    calling the backend directly skips that per-call overhead, which dominates for the
    O(turns^2) tokens of teacher-forced prompts."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return [_encode(tokenizer, t) for t in texts]
    return [[int(i) for i in e.ids] for e in backend.encode_batch(texts, add_special_tokens=False)]


def turn_prompts(tokenizer: Any, scenario: Scenario) -> list[TurnPrompt]:
    """One prompt per assistant message, in order (the last one is the final query's)."""
    ks = scenario.assistant_indices
    texts = [render(tokenizer, scenario.messages[:k], add_generation_prompt=True) for k in ks]
    return [
        TurnPrompt(k, tuple(ids), scenario.messages[k]["content"])
        for k, ids in zip(ks, _encode_many(tokenizer, texts), strict=True)
    ]


def conversation_ids(tokenizer: Any, scenario: Scenario) -> list[int]:
    """Token ids of the whole conversation, as the training format renders it."""
    return _encode(tokenizer, render(tokenizer, scenario.messages, add_generation_prompt=False))
