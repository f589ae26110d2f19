"""What a scenario must reproduce: per turn, its prompt and the tokens greedy decoding must
produce for the output to be the truth, or why the fast argument does not hold for it.

The fast path's argument needs every turn's prompt to be a token prefix of the whole
conversation (then one forward pass computes every turn's logits) and generation settings
that leave greedy decisions alone. :class:`Planner` checks both and makes a
:class:`ScenarioPlan`, or a :class:`ReferenceOnly` naming what fails (the scenario is then
decoded by the reference path, with the reason in ``Rollout.notes``). This is where the
prompts and the expected tokens come from: the one seam a decoding mode with other prompts
replaces.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.model.prefix import proven_scenario_prompts
from pytest_memeval.model.prompts import TurnPrompt

__all__ = [
    "Planner",
    "ReferenceOnly",
    "ScenarioPlan",
    "TurnPlan",
    "expected_tokens",
    "unsafe_generation_settings",
]

#: Generation settings that make ``generate`` change logits (or stop) in greedy mode, with the
#: values that leave greedy decisions alone. Any other value: the fast argument does not hold.
_NEUTRAL_SETTINGS: dict[str, tuple[object, ...]] = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None, []),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "sequence_bias": (None, {}),
    "guidance_scale": (None, 1.0),
    "stop_strings": (None, [], ""),
    "penalty_alpha": (None, 0, 0.0),
    "dola_layers": (None,),
    "prompt_lookup_num_tokens": (None,),
    "watermarking_config": (None,),
    "max_time": (None,),
}


def unsafe_generation_settings(generation_config: object) -> list[str]:
    """Settings of ``generation_config`` under which teacher forcing is not greedy decoding."""
    found = []
    for name, neutral in _NEUTRAL_SETTINGS.items():
        value = getattr(generation_config, name, None)
        if not any(value is n if n is None else value == n for n in neutral):
            found.append(f"{name}={value!r}")
    return found


@dataclass(frozen=True)
class TurnPlan:
    """What the teacher-forced check needs for one assistant message."""

    prompt: TurnPrompt
    #: tokens greedy decoding must produce to reproduce the truth (truth, stop token last
    #: when it fits in ``max_new_tokens``); empty: no truth to compare, always generate
    expected: tuple[int, ...]
    #: True when ``expected`` ends with a stop id (any stop id is accepted there)
    ends_with_stop: bool


@dataclass(frozen=True)
class ScenarioPlan:
    """A scenario the fast path decodes: its whole conversation's ids and its turns."""

    scenario: Scenario
    full: Sequence[int]
    turns: tuple[TurnPlan, ...]


@dataclass(frozen=True)
class ReferenceOnly:
    """A scenario the fast argument does not hold for: its prompts, and why (the note its
    rollout carries)."""

    prompts: Sequence[TurnPrompt]
    note: str


def expected_tokens(
    full: Sequence[int], prompt: TurnPrompt, stop: frozenset[int], max_new_tokens: int
) -> TurnPlan:
    """The tokens greedy decoding must produce at this turn to reproduce the truth."""
    start = len(prompt.ids)
    end = next((i for i in range(start, len(full)) if full[i] in stop), None)
    if end is not None and end - start + 1 <= max_new_tokens:
        return TurnPlan(prompt, tuple(full[start : end + 1]), ends_with_stop=True)
    if end is None and len(full) - start < max_new_tokens:
        # The conversation ends without a stop token before max_new_tokens: no truth to
        # check the model against.
        return TurnPlan(prompt, (), ends_with_stop=False)
    # The truth does not stop within max_new_tokens: greedy decoding, if it follows the
    # truth, runs into the limit (stopped=False) with these tokens.
    return TurnPlan(prompt, tuple(full[start : start + max_new_tokens]), ends_with_stop=False)


class Planner(Stage):
    """Plans scenarios for one loaded model and token budget."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        model = shared.loaded.model
        #: the model's generation settings that change greedy decisions (none: the fast path)
        self.unsafe = unsafe_generation_settings(getattr(model, "generation_config", None))

    def plan(
        self, scenario: Scenario, turns: Sequence[int] | None = None
    ) -> ScenarioPlan | ReferenceOnly:
        """The scenario's teacher-forced plan, or why the fast path cannot hold for it.

        ``turns``: plan only the assistant messages with these numbers (0-based, in order;
        a free-running round, ``history.py``); the plan's ``turns`` are then theirs."""
        started = time.perf_counter()
        # The same ids as ``prompts.scenario_prompts``; most prompts' ids are proven to be
        # the conversation's prefix without tokenising them (see ``model/prefix.py``).
        prompts, full, proven = proven_scenario_prompts(self.loaded.tokenizer, scenario, turns)
        self.stats.prompts_proven += proven
        self.seconds.prompts += time.perf_counter() - started
        if self.unsafe:
            return ReferenceOnly(
                prompts,
                "fast path off: generation settings change greedy decisions ("
                + ", ".join(self.unsafe)
                + "); decoded with the reference path",
            )
        for prompt in prompts:
            if tuple(full[: len(prompt.ids)]) != prompt.ids:
                n = scenario.assistant_indices.index(prompt.message_index)
                return ReferenceOnly(
                    prompts,
                    f"fast path off: the prompt of assistant message {n + 1} "
                    f"(messages[{prompt.message_index}]) is not a token prefix of the "
                    "whole conversation (the chat template renders history differently "
                    "from a generation prompt); decoded with the reference path",
                )
        planned = tuple(
            expected_tokens(full, prompt, self.stop, self.max_new_tokens) for prompt in prompts
        )
        return ScenarioPlan(scenario, full, planned)
