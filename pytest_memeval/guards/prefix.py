"""The prefix contract: each turn's prompt is a token prefix of the next one's.

The prompt of each assistant turn must be a token prefix of the next turn's prompt, and the
last (the final query's) a prefix of the training rendering of the whole conversation (what
the model was trained on): evaluation then feeds the model exactly the tokens it was trained
on. :func:`check_prefix` checks that on a scenario's :class:`~.tokens.PromptTokens`, and also
refuses a doubled BOS and the unknown token.
"""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

from pytest_memeval.guards.tokens import PromptTokens, prefix_break, tokens_window

__all__ = ["check_prefix"]


class _Step(NamedTuple):
    """One token sequence of a scenario, in the order each must prefix the next."""

    label: str
    ids: tuple[int, ...]


def _steps(tokens: PromptTokens) -> list[_Step]:
    """Each assistant turn's prompt, then the training rendering of the whole conversation."""
    steps: list[_Step] = []
    n = len(tokens.prompts)
    for t, (k, ids) in enumerate(tokens.prompts):
        label = f"turn {t} (messages[{k}])" if t < n - 1 else f"the final query (messages[{k}])"
        steps.append(_Step(f"the prompt of {label}", ids))
    steps.append(_Step("the training rendering of the whole conversation", tokens.conversation))
    return steps


def check_prefix(
    variant: str,
    tokens: PromptTokens,
    *,
    unk_token_id: int | None = None,
    bos_token_id: int | None = None,
) -> str | None:
    """The prefix property of one scenario's prompts; ``None`` when it holds.

    Each assistant turn's prompt must be a token prefix of the next turn's prompt, and the
    last (the final query's) a prefix of the conversation's training rendering: evaluation
    then feeds the model exactly the tokens it was trained on. Also refuses a doubled BOS
    and the unknown token (a word the tokenizer cannot encode).
    """
    sid = tokens.scenario_id
    steps = _steps(tokens)
    for step in steps:
        if bos_token_id is not None and step.ids[:2] == (bos_token_id, bos_token_id):
            return (
                f"{variant} scenario {sid!r}: {step.label} starts with a doubled BOS token "
                f"({bos_token_id} {tokens.vocab.get(bos_token_id)!r} twice): the chat template "
                "(or the data) writes it twice, while the model was trained on one (the "
                "harness encodes the rendered text without adding special tokens)"
            )
        if unk_token_id is not None and unk_token_id in step.ids:
            at = step.ids.index(unk_token_id)
            return (
                f"{variant} scenario {sid!r}: {step.label} contains the unknown token at "
                f"position {at}: the tokenizer cannot encode a word of the data\n"
                f"  {tokens_window(step.ids, tokens.vocab, at)}"
            )
    for a, b in pairwise(steps):
        pos = prefix_break(a.ids, b.ids)
        if pos is None:
            continue
        got = f"{a.ids[pos]} {tokens.vocab.get(a.ids[pos], '?')!r}"
        there = (
            f"{b.ids[pos]} {tokens.vocab.get(b.ids[pos], '?')!r}" if pos < len(b.ids) else "its end"
        )
        return "\n".join(
            [
                f"{variant} scenario {sid!r}: {a.label} is not a token prefix of {b.label}",
                f"  first difference at token {pos}: {got} vs {there}",
                f"  {a.label}: {tokens_window(a.ids, tokens.vocab, pos)}",
                f"  {b.label}: {tokens_window(b.ids, tokens.vocab, pos)}",
            ]
        )
    return None
