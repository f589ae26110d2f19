"""The reference decoder: one greedy ``generate`` call per assistant message.

This is what a careful user of transformers writes, and the ground truth the fast path is
proven against: each turn's prompt is the history rendered by the chat template, decoding is
greedy with the checkpoint's stop ids, and the output is decoded without special tokens.
The history is the benchmark's (teacher-forced, ``history="truth"``) or the model's own
(free-running, ``history="model"``): then the decoder feeds its outputs back turn by turn,
each as :func:`~pytest_memeval.core.history.fed_back` makes it, and the rollout holds them
that way (what the record stores is what the later prompts held).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.transformers import full_attention_kv, generate_with_logits
from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.history import HISTORY_MODEL, HISTORY_TRUTH, fed_back, history_name
from pytest_memeval.core.records import Rollout, TurnOutput
from pytest_memeval.model.loading import LoadedModel
from pytest_memeval.model.prompts import TurnPrompt, free_running_prompt, turn_prompts

if TYPE_CHECKING:
    import torch

__all__ = [
    "ReferenceDecoder",
    "ReferenceSteps",
    "decode_new_tokens",
    "generate_from",
    "greedy_settings",
    "prompt_tail",
    "reference_rollout",
    "reference_steps",
]


def greedy_settings(loaded: LoadedModel) -> dict[str, object]:
    """The settings of every ``generate`` call either path makes: greedy, one beam, the
    checkpoint's stop ids and pad id. The one place they are written, so that the fast path's
    calls (which stand in for this path's) cannot drift from the reference's."""
    return {
        "do_sample": False,
        "num_beams": 1,
        "eos_token_id": list(loaded.stop_ids),
        "pad_token_id": loaded.pad_id,
    }


def _prompt_inputs(loaded: LoadedModel, ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """One unpadded prompt as ``generate`` takes it."""
    # Deferred: torch takes seconds to import, and replay / compare never decode.
    import torch

    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=loaded.device)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def generate_from(loaded: LoadedModel, ids: Sequence[int], max_new_tokens: int) -> TurnOutput:
    """Greedy-generate one turn from prompt ``ids``: the reference call."""
    # Deferred: torch takes seconds to import, and replay / compare never decode.
    import torch

    inputs = _prompt_inputs(loaded, ids)
    with torch.inference_mode():
        out = loaded.model.generate(
            **inputs, max_new_tokens=max_new_tokens, **greedy_settings(loaded)
        )
    new = [int(t) for t in out[0, len(ids) :]]
    return decode_new_tokens(loaded, new)


@dataclass(frozen=True)
class ReferenceSteps:
    """The reference call's new tokens and, per step, its next-token logits in fp32; with
    ``keep_prompt_cache``, also its prompt's keys and values per layer (``prompt_cache``)."""

    tokens: list[int]
    logits: list[torch.Tensor]
    #: the cache the call's prefill left: ``(keys, values)`` per layer, cut to the prompt's
    #: positions (later steps only append to it, so these are the prefill's own bits);
    #: ``None`` unless kept, or where the cache is not plain full-attention layers
    prompt_cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None


def reference_steps(
    loaded: LoadedModel, ids: Sequence[int], max_new_tokens: int, *, keep_prompt_cache: bool = False
) -> ReferenceSteps:
    """:func:`generate_from`'s call on ``ids``, keeping each step's logits (what the fast
    path's calibration compares its own computations with) and, with ``keep_prompt_cache``,
    the prompt's cache (the exact stage's check continues from it instead of a prefill of
    its own)."""
    # Deferred: torch takes seconds to import, and replay / compare never decode.
    import torch

    inputs = _prompt_inputs(loaded, ids)
    with torch.inference_mode():
        out = generate_with_logits(
            loaded.model,
            {**inputs, "max_new_tokens": max_new_tokens, **greedy_settings(loaded)},
        )
    tokens = [int(t) for t in out.sequences[0, len(ids) :]]
    logits = [step[0].float() for step in out.logits]
    layers = full_attention_kv(out.cache) if keep_prompt_cache else None
    if layers is None:
        return ReferenceSteps(tokens, logits)
    cut = slice(0, len(ids))
    return ReferenceSteps(tokens, logits, [(k[:, :, cut], v[:, :, cut]) for k, v in layers])


def decode_new_tokens(loaded: LoadedModel, new: Sequence[int]) -> TurnOutput:
    """Text and stop flag of generated tokens (everything up to the first stop id)."""
    stop = set(loaded.stop_ids)
    for i, tok in enumerate(new):
        if tok in stop:
            text = loaded.tokenizer.decode(list(new[:i]), skip_special_tokens=True)
            return TurnOutput(text=text, stopped=True)
    return TurnOutput(
        text=loaded.tokenizer.decode(list(new), skip_special_tokens=True), stopped=False
    )


def prompt_tail(loaded: LoadedModel, ids: Sequence[int], n_tokens: int = 48) -> str:
    """The end of a prompt as text, for failure messages and reports."""
    return str(loaded.tokenizer.decode(list(ids[-n_tokens:]), skip_special_tokens=False))


def reference_rollout(
    loaded: LoadedModel,
    prompts: Sequence[TurnPrompt],
    max_new_tokens: int,
    path: str,
    notes: tuple[str, ...] = (),
) -> Rollout:
    """One greedy ``generate`` per prompt: the reference path, shared with the fast path's
    fallback so the two cannot drift apart."""
    outputs = tuple(generate_from(loaded, p.ids, max_new_tokens) for p in prompts)
    return Rollout(outputs, path, prompt_tail(loaded, prompts[-1].ids), notes)


def free_running_rollout(
    loaded: LoadedModel,
    scenario: Scenario,
    max_new_tokens: int,
    path: str,
    notes: tuple[str, ...] = (),
    settled: Sequence[TurnOutput] = (),
) -> Rollout:
    """One greedy ``generate`` per assistant message, each on the prompt whose earlier
    assistant messages are this rollout's own outputs so far (free-running): the reference
    of ``--memeval-history model``. Every output is stored as it was fed back
    (:func:`~pytest_memeval.core.history.fed_back`), the final answer too.

    ``settled``: the outputs of the first turns, already decoded (free-running, as fed
    back) by a caller that hands the rest of the scenario over (the fast path)."""
    texts = [out.text for out in settled]
    outputs = list(settled)
    prompt: TurnPrompt | None = None
    if len(outputs) >= len(scenario.assistant_indices):
        raise ValueError(f"scenario {scenario.id}: every turn is settled already")
    for turn in range(len(outputs), len(scenario.assistant_indices)):
        prompt = free_running_prompt(loaded.tokenizer, scenario, texts, turn)
        out = generate_from(loaded, prompt.ids, max_new_tokens)
        texts.append(fed_back(out.text))
        outputs.append(TurnOutput(texts[-1], out.stopped, out.generated))
    assert prompt is not None  # a scenario has at least its final assistant message
    return Rollout(
        tuple(outputs), path, prompt_tail(loaded, prompt.ids), notes, history=HISTORY_MODEL
    )


class ReferenceDecoder:
    """Greedy ``generate`` for every assistant message, one call each.

    ``history``: ``truth`` (teacher-forced, the default) or ``model`` (free-running:
    :func:`free_running_rollout`). ``path`` and ``notes`` name a decoder that stands in for
    another (the fast path's free-running fallback): its records say ``decode: path`` and
    carry the notes, its outputs are this decoder's.
    """

    path = "reference"

    def __init__(
        self,
        loaded: LoadedModel,
        max_new_tokens: int,
        *,
        history: str = HISTORY_TRUTH,
        path: str = "reference",
        notes: tuple[str, ...] = (),
    ) -> None:
        self.loaded = loaded
        self.max_new_tokens = max_new_tokens
        self.history = history_name(history, "history")
        self.path = path
        self.notes = notes

    def rollout(self, scenario: Scenario) -> Rollout:
        if self.history == HISTORY_MODEL:
            return free_running_rollout(
                self.loaded, scenario, self.max_new_tokens, self.path, self.notes
            )
        prompts = turn_prompts(self.loaded.tokenizer, scenario)
        return reference_rollout(self.loaded, prompts, self.max_new_tokens, self.path, self.notes)

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """The reference path decodes one scenario at a time; nothing to prepare."""
