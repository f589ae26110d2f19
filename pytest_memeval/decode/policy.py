"""A model as the closed loop's policy: one greedy ``generate`` over the conversation a step.

The prompt contract (docs/closed-loop.md): the conversation the episode runner hands over
(system, then each observation as a user message and each earlier action as an assistant
message) is rendered by the chat template with the generation prompt, exactly as every other
profile's prompts (:func:`~pytest_memeval.model.prompts.render`); the reference call
(:func:`~pytest_memeval.decode.reference.generate_from`: greedy, the checkpoint's stop ids,
special tokens skipped) decodes the action. An output that reached ``max_new_tokens`` without
a stop id is returned as it is, flagged ``truncated``; a prompt that with ``max_new_tokens``
more would pass the model's context raises
:class:`~pytest_memeval.env.ContextLimitExceeded` before any call.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_memeval.decode.reference import generate_from
from pytest_memeval.env import ContextLimitExceeded, Message, PolicyOutput
from pytest_memeval.model.loading import LoadedModel
from pytest_memeval.model.prompts import encode_many, render

__all__ = ["ModelPolicy", "model_context"]


def model_context(loaded: LoadedModel) -> int | None:
    """The model's context length (``max_position_embeddings``), ``None`` if it names none."""
    value = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


class ModelPolicy:
    """The reference decoder as a :data:`~pytest_memeval.env.Policy` (callable on messages).

    ``context_limit``: tokens a prompt and its output may take together; ``None``: the
    model's own context (:func:`model_context`).
    """

    def __init__(
        self, loaded: LoadedModel, max_new_tokens: int, *, context_limit: int | None = None
    ) -> None:
        self.loaded = loaded
        self.max_new_tokens = max_new_tokens
        self.context_limit = context_limit if context_limit is not None else model_context(loaded)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The token ids of the next action's prompt: the chat template's rendering of the
        conversation with the generation prompt."""
        plain = [{"role": m["role"], "content": m["content"]} for m in messages]
        text = render(self.loaded.tokenizer, plain, add_generation_prompt=True)
        return encode_many(self.loaded.tokenizer, [text])[0]

    def over_context(self, ids: Sequence[int]) -> ContextLimitExceeded | None:
        """The error a prompt of ``ids`` raises (it and ``max_new_tokens`` more pass the
        context), or ``None`` when it fits: checked before any model call."""
        limit = self.context_limit
        if limit is not None and len(ids) + self.max_new_tokens > limit:
            return ContextLimitExceeded(
                f"the next prompt is {len(ids)} tokens; with max_new_tokens="
                f"{self.max_new_tokens} it passes the context of {limit}"
            )
        return None

    def __call__(self, messages: Sequence[Message]) -> PolicyOutput:
        ids = self.prompt_ids(messages)
        over = self.over_context(ids)
        if over is not None:
            raise over
        out = generate_from(self.loaded, ids, self.max_new_tokens)
        return PolicyOutput(out.text, truncated=not out.stopped)
