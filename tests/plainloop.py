"""The plain per-turn ``generate`` loop a user writes by hand, independent of the plugin.

The chat template applied by ``apply_chat_template``, ``model.generate`` greedy with the
model's own generation config (its eos ids stop a turn), the new tokens decoded without
special tokens. Decoders and plugin runs are checked against it turn by turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Outputs = list[tuple[str, bool]]

#: New tokens of a greedy ``generate`` by ``(prompt ids, max_new_tokens)``, for one model:
#: a loop given one skips the calls whose exact prompt an earlier loop on that model already
#: ran (greedy decoding is a pure function of the prompt ids, so nothing else can differ).
Memo = dict[tuple[tuple[int, ...], int], list[int]]

#: Record fields that say where and how fast a scenario ran, not what was predicted.
RUNTIME_FIELDS = ("worker", "device", "decode_s", "decode_batch", "decode_batch_size")


def _generated(model: Any, enc: Any, max_new_tokens: int, memo: Memo | None) -> list[int]:
    """The new tokens of one greedy ``model.generate`` on ``enc`` (from ``memo`` if it has
    them for this prompt)."""
    import torch

    key = (tuple(enc["input_ids"][0].tolist()), max_new_tokens)
    if memo is not None and key in memo:
        return memo[key]
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    new: list[int] = out[0, enc["input_ids"].shape[1] :].tolist()
    if memo is not None:
        memo[key] = new
    return new


def plain_loop(
    model: Any,
    tok: Any,
    messages: Sequence[Mapping[str, str]],
    max_new_tokens: int,
    memo: Memo | None = None,
) -> Outputs:
    """``(text, stopped)`` of one greedy ``generate`` per assistant message, each from its
    teacher-forced history (``memo``: see :data:`Memo`)."""
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    outputs = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        enc = tok.apply_chat_template(
            [dict(m) for m in messages[:k]],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )
        new = _generated(model, enc, max_new_tokens, memo)
        stopped = bool(new) and new[-1] in eos_ids
        outputs.append(
            (tok.decode(new[:-1] if stopped else new, skip_special_tokens=True), stopped)
        )
    return outputs


def plain_free_running(
    model: Any,
    tok: Any,
    messages: Sequence[Mapping[str, str]],
    max_new_tokens: int,
    memo: Memo | None = None,
) -> Outputs:
    """:func:`plain_loop` free-running (``--memeval-history model``): each assistant
    message's prompt holds the loop's own earlier answers, each fed back with surrounding
    whitespace stripped (what a chat client sends back), and the answers are given so
    (``memo``: see :data:`Memo`; up to the loop's first departure from the truth its prompts
    are the teacher-forced loop's)."""
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    history = [dict(m) for m in messages]
    outputs: Outputs = []
    for k, message in enumerate(history):
        if message["role"] != "assistant":
            continue
        enc = tok.apply_chat_template(
            history[:k], add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        new = _generated(model, enc, max_new_tokens, memo)
        stopped = bool(new) and new[-1] in eos_ids
        text = tok.decode(new[:-1] if stopped else new, skip_special_tokens=True).strip()
        outputs.append((text, stopped))
        history[k] = {"role": "assistant", "content": text}
    return outputs


def rollout_outputs(rollout: Any) -> Outputs:
    return [(o.text, o.stopped) for o in rollout.outputs]


def record_outputs(record: Mapping[str, Any]) -> Outputs:
    return [(t["pred"], t["stopped"]) for t in record["turns"]] + [
        (record["final_pred"], record["final_stopped"])
    ]


def predicted(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record without its runtime fields: what two runs of one model must agree on."""
    return {k: v for k, v in record.items() if k not in RUNTIME_FIELDS}
