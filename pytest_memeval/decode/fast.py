"""The fast decoder: one teacher-forced forward pass per scenario, ``generate`` only where needed.

Every assistant message is predicted from the teacher-forced history, so the prompt of turn
``k`` is a token prefix of the whole conversation (checked per scenario, see below). One
forward pass over the conversation therefore gives, at every position, the logits the
reference path's ``generate`` sees at its first step, and at the later answer positions the
logits it would see *if* it had produced the truth so far. Greedy decoding reproduces the
truth exactly when the argmax at each answer position is the truth token and the argmax after
it is a stop id; then the prediction is the truth, decoded as the reference decodes it. At
every other turn this decoder runs a real greedy ``generate`` from the prefix's key/value
cache (cropped out of the forward pass, so the history is not re-run).

"Exact" means: the same outputs as :class:`~.reference.ReferenceDecoder` for every turn, as
long as no greedy decision of either path is a near tie. Two computations of the same logits
(batched vs single, cached vs prefilled) differ by rounding; a decision whose top-1/top-2 logit
margin (in fp32) is below :func:`default_margin` for the model's dtype is not trusted: a
teacher-forced check with such a margin is replaced by a real ``generate``, and a cached
``generate`` with such a margin at any step is replaced by the reference call itself
(``generate_from`` on the full prompt, re-running the history). See ``docs/decoding.md``.

Where the argument cannot hold the decoder says so in ``Rollout.notes`` and decodes the
scenario with the reference path: a chat template that renders history differently from a
generation prompt (the prefix property fails), or generation settings whose logits
processors change greedy decisions (repetition penalty, banned words, minimum length...).
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..benchmark import Scenario
from ..model import LoadedModel
from ..prompts import TurnPrompt, scenario_prompts
from ._types import Rollout, TurnOutput
from .reference import decode_new_tokens, generate_from, prompt_tail, reference_rollout

__all__ = [
    "DEFAULT_ACCELERATOR_BATCH_SIZE",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_BATCH_TOKENS",
    "FastDecoder",
    "default_margin",
]

#: Scenarios per forward pass (an upper bound; :data:`DEFAULT_MAX_BATCH_TOKENS` also applies),
#: by device kind. On CPU, eager attention over a wide padded batch costs more than batching
#: saves (measured on the demo model: 4 beats 1, 8 and 16); accelerators want wide batches.
DEFAULT_BATCH_SIZES: dict[str, int] = {"cpu": 4}
DEFAULT_ACCELERATOR_BATCH_SIZE = 16
#: Rows per batched ``generate`` call, as a multiple of the batch size.
GENERATE_ROWS_FACTOR = 4
#: Padded tokens per forward pass (batch rows x longest row), bounding activation memory.
DEFAULT_MAX_BATCH_TOKENS = 32768

#: Top-1/top-2 logit margins (fp32 units) below which a greedy decision is not trusted, by
#: model dtype. Batched-vs-single and cached-vs-prefilled logits differ by rounding only: at
#: most 1e-5 in fp32 on the demo model (logits up to 15), a few units in the last place in
#: 16-bit (an ulp is 1/128 of the logit's magnitude in bfloat16, 1/1024 in float16). The
#: bounds sit far above those differences (1000x in fp32, ~8-16 ulps at |logit| 16-32 in
#: 16-bit); a larger bound only makes the decoder generate more turns, never less exact.
MARGINS: dict[str, float] = {"float32": 1e-2, "float64": 1e-6, "float16": 0.25, "bfloat16": 1.0}

#: Generation settings that make ``generate`` change logits (or stop) in greedy mode, with the
#: values that leave greedy decisions alone. Any other value: the fast argument does not hold.
_NEUTRAL_SETTINGS: dict[str, tuple[Any, ...]] = {
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


def default_margin(dtype: str) -> float:
    """The margin bound used for a model loaded in ``dtype`` (see :data:`MARGINS`)."""
    return MARGINS.get(dtype, MARGINS["bfloat16"])


def unsafe_generation_settings(generation_config: Any) -> list[str]:
    """Settings of ``generation_config`` under which teacher forcing is not greedy decoding."""
    found = []
    for name, neutral in _NEUTRAL_SETTINGS.items():
        value = getattr(generation_config, name, None)
        if not any(value is n if n is None else value == n for n in neutral):
            found.append(f"{name}={value!r}")
    return found


@dataclass
class _Turn:
    """What the teacher-forced check needs for one assistant message."""

    prompt: TurnPrompt
    #: tokens greedy decoding must produce to reproduce the truth (truth, stop token last
    #: when it fits in ``max_new_tokens``); empty: no truth to compare, always generate
    expected: tuple[int, ...]
    #: True when ``expected`` ends with a stop id (any stop id is accepted there)
    ends_with_stop: bool


@dataclass
class _Plan:
    scenario: Scenario
    full: list[int]
    turns: list[_Turn]


class FastDecoder:
    """Teacher-forced greedy check over whole conversations, batched across scenarios.

    ``prefetch(scenarios)`` decodes a group of scenarios in length-sorted batches and keeps
    their rollouts until ``rollout`` asks for them; ``rollout`` of a scenario not prefetched
    decodes it alone. ``stats`` counts what was decided how (for ``memeval bench`` and tests).
    """

    path = "fast"

    def __init__(
        self,
        loaded: LoadedModel,
        max_new_tokens: int,
        *,
        batch_size: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        margin: float | None = None,
    ) -> None:
        if batch_size is None:
            kind = str(loaded.device).split(":")[0]
            batch_size = DEFAULT_BATCH_SIZES.get(kind, DEFAULT_ACCELERATOR_BATCH_SIZE)
        if batch_size < 1 or max_batch_tokens < 1 or max_new_tokens < 1:
            raise ValueError("batch_size, max_batch_tokens and max_new_tokens must be >= 1")
        self.loaded = loaded
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.margin = default_margin(loaded.dtype) if margin is None else float(margin)
        self.stats: Counter[str] = Counter()
        #: seconds spent building prompts, in forward passes and in ``generate``
        self.seconds: dict[str, float] = defaultdict(float)
        self._ready: dict[str, Rollout] = {}
        self._stop = frozenset(loaded.stop_ids)
        base = (
            loaded.model.get_base_model()
            if hasattr(loaded.model, "get_base_model")
            else loaded.model
        )
        params = inspect.signature(base.forward).parameters
        # transformers 5 renamed ``past_key_values`` to ``cache``; support both spellings.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params
        self._position_ids = "position_ids" in params
        self._unsafe = unsafe_generation_settings(getattr(loaded.model, "generation_config", None))

    # -- Decoder protocol --------------------------------------------------------------------

    def rollout(self, scenario: Scenario) -> Rollout:
        """The scenario's rollout: prefetched if it was, else decoded now on its own."""
        ready = self._ready.pop(scenario.id, None)
        if ready is not None:
            return ready
        return self.decode([scenario])[0]

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """Decode ``scenarios`` now, batched, and keep their rollouts for ``rollout``."""
        todo = [s for s in _unique(scenarios) if s.id not in self._ready]
        if todo:
            for scenario, rollout in zip(todo, self.decode(todo), strict=True):
                self._ready[scenario.id] = rollout

    # -- decoding ----------------------------------------------------------------------------

    def decode(self, scenarios: Sequence[Scenario]) -> list[Rollout]:
        """Rollouts of ``scenarios`` (in their order), computed in length-sorted batches."""
        results: dict[int, Rollout] = {}
        plans: list[tuple[int, _Plan]] = []
        for pos, scenario in enumerate(scenarios):
            self.stats["scenarios"] += 1
            plan, prompts, reason = self._plan(scenario)
            if plan is None:
                results[pos] = self._reference_rollout(prompts, reason)
            else:
                plans.append((pos, plan))
        # Longest first: the first batch fixes the largest activation size, so running out of
        # memory shows at once; similar lengths share batches, so little padding is computed.
        plans.sort(key=lambda p: -len(p[1].full))
        for batch in self._batches(plans):
            for (pos, _), rollout in zip(
                batch, self._decode_batch([p for _, p in batch]), strict=True
            ):
                results[pos] = rollout
        return [results[i] for i in range(len(scenarios))]

    def _batches(self, plans: list[tuple[int, _Plan]]) -> Iterable[list[tuple[int, _Plan]]]:
        batch: list[tuple[int, _Plan]] = []
        for item in plans:
            # Sorted longest first, so the batch's first row sets its padded width.
            width = len(batch[0][1].full) if batch else len(item[1].full)
            if batch and (
                len(batch) >= self.batch_size or (len(batch) + 1) * width > self.max_batch_tokens
            ):
                yield batch
                batch = []
            batch.append(item)
        if batch:
            yield batch

    def _plan(self, scenario: Scenario) -> tuple[_Plan | None, list[TurnPrompt], str]:
        """The scenario's teacher-forced plan, or ``None`` and why the fast path cannot hold."""
        tokenizer = self.loaded.tokenizer
        started = time.perf_counter()
        prompts, full = scenario_prompts(tokenizer, scenario)
        self.seconds["prompts"] += time.perf_counter() - started
        if self._unsafe:
            return (
                None,
                prompts,
                (
                    "fast path off: generation settings change greedy decisions ("
                    + ", ".join(self._unsafe)
                    + "); decoded with the reference path"
                ),
            )
        for n, prompt in enumerate(prompts):
            if tuple(full[: len(prompt.ids)]) != prompt.ids:
                return (
                    None,
                    prompts,
                    (
                        f"fast path off: the prompt of assistant message {n + 1} "
                        f"(messages[{prompt.message_index}]) is not a token prefix of the "
                        "whole conversation (the chat template renders history differently "
                        "from a generation prompt); decoded with the reference path"
                    ),
                )
        turns = [self._expected(full, prompt) for prompt in prompts]
        return _Plan(scenario, full, turns), prompts, ""

    def _expected(self, full: list[int], prompt: TurnPrompt) -> _Turn:
        """The tokens greedy decoding must produce at this turn to reproduce the truth."""
        start = len(prompt.ids)
        end = next((i for i in range(start, len(full)) if full[i] in self._stop), None)
        if end is not None and end - start + 1 <= self.max_new_tokens:
            return _Turn(prompt, tuple(full[start : end + 1]), ends_with_stop=True)
        if end is None and len(full) - start < self.max_new_tokens:
            # The conversation ends without a stop token before max_new_tokens: no truth to
            # check the model against.
            return _Turn(prompt, (), ends_with_stop=False)
        # The truth does not stop within max_new_tokens: greedy decoding, if it follows the
        # truth, runs into the limit (stopped=False) with these tokens.
        return _Turn(prompt, tuple(full[start : start + self.max_new_tokens]), ends_with_stop=False)

    def _reference_rollout(self, prompts: list[TurnPrompt], note: str) -> Rollout:
        """Exactly what :class:`~.reference.ReferenceDecoder` does, plus ``note``."""
        self.stats["reference_scenarios"] += 1
        self.stats["turns"] += len(prompts)
        self.stats["generated"] += len(prompts)
        started = time.perf_counter()
        rollout = reference_rollout(self.loaded, prompts, self.max_new_tokens, self.path, (note,))
        self.seconds["generate"] += time.perf_counter() - started
        return rollout

    def _decode_batch(self, plans: list[_Plan]) -> list[Rollout]:
        import torch

        device = self.loaded.device
        width = max(len(p.full) for p in plans)
        ids = torch.full((len(plans), width), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(plans), width), dtype=torch.long)
        for row, plan in enumerate(plans):
            ids[row, : len(plan.full)] = torch.tensor(plan.full, dtype=torch.long)
            mask[row, : len(plan.full)] = 1
        # Positions whose logits are checked: the one before each expected token.
        needed = sorted(
            {
                len(t.prompt.ids) - 1 + j
                for p in plans
                for t in p.turns
                for j in range(len(t.expected))
            }
        )
        kwargs: dict[str, Any] = {"attention_mask": mask.to(device), "use_cache": True}
        if self._position_ids:
            # What ``generate`` passes (positions from the mask): with right padding every
            # real token gets its own index, exactly as in the reference path's prefill.
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            kwargs["position_ids"] = positions.to(device)
        column = {pos: pos for pos in needed}
        if self._logits_to_keep and needed:
            kwargs["logits_to_keep"] = torch.tensor(needed, dtype=torch.long, device=device)
            column = {pos: i for i, pos in enumerate(needed)}
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.loaded.model(input_ids=ids.to(device), **kwargs)
            # Margins and argmax in fp32, as ``generate`` upcasts its next-token logits.
            top = out.logits.float().topk(2, dim=-1)
            best = top.indices[..., 0].cpu()
            margin = (top.values[..., 0] - top.values[..., 1]).cpu()
        self.seconds["forward"] += time.perf_counter() - started
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        del out
        outputs: list[list[TurnOutput | None]] = []
        pending: list[tuple[int, int, _Turn]] = []  # (row, turn number, turn) to generate
        for row, plan in enumerate(plans):
            outputs.append([])
            for n, turn in enumerate(plan.turns):
                self.stats["turns"] += 1
                decided = self._teacher_forced(row, turn, best, margin, column)
                if decided is None:
                    pending.append((row, n, turn))
                outputs[row].append(decided)
        for (row, n, _), generated in zip(
            pending, self._generate_many(pending, cache), strict=True
        ):
            outputs[row][n] = generated
        del cache
        rollouts = []
        for row, plan in enumerate(plans):
            done = tuple(o for o in outputs[row] if o is not None)
            assert len(done) == len(plan.turns)
            tail = prompt_tail(self.loaded, plan.turns[-1].prompt.ids)
            rollouts.append(Rollout(done, self.path, tail))
        return rollouts

    def _teacher_forced(
        self, row: int, turn: _Turn, best: Any, margin: Any, column: dict[int, int]
    ) -> TurnOutput | None:
        """The turn's output if the forward pass proves greedy decoding yields the truth."""
        if not turn.expected:
            self.stats["generated_no_truth"] += 1
            return None
        start = len(turn.prompt.ids)
        produced = []
        for j, want in enumerate(turn.expected):
            col = column[start - 1 + j]
            got = int(best[row, col])
            if float(margin[row, col]) < self.margin:
                self.stats["generated_near_tie"] += 1
                return None
            last_stop = turn.ends_with_stop and j == len(turn.expected) - 1
            # Any stop id ends the turn the same way; elsewhere only the truth token will do.
            if got != want and not (last_stop and got in self._stop):
                self.stats["generated_mismatch"] += 1
                return None
            produced.append(got)
        self.stats["teacher_forced"] += 1
        return dataclasses.replace(decode_new_tokens(self.loaded, produced), generated=False)

    def _generate_many(self, pending: list[tuple[int, int, _Turn]], cache: Any) -> list[TurnOutput]:
        """Greedy ``generate`` for these turns, batched, from their prefixes' cached keys/values."""
        self.stats["generated"] += len(pending)
        started = time.perf_counter()
        results: dict[int, TurnOutput] = {}
        # Longest prompt first, in chunks bounded like the forward batches (rows x width).
        order = sorted(range(len(pending)), key=lambda i: -len(pending[i][2].prompt.ids))
        chunks: list[list[int]] = []
        for i in order:
            chunk = chunks[-1] if chunks else []
            width = len(pending[chunk[0]][2].prompt.ids) if chunk else 0
            # A generate step feeds one token per row: rows are cheap, calls are not.
            rows_cap = GENERATE_ROWS_FACTOR * self.batch_size
            if (
                chunk
                and len(chunk) < rows_cap
                and (len(chunk) + 1) * width <= self.max_batch_tokens
            ):
                chunk.append(i)
            else:
                chunks.append([i])
        for chunk in chunks:
            rows = [(pending[k][0], pending[k][2]) for k in chunk]
            for k, out in zip(chunk, self._generate_chunk(rows, cache), strict=True):
                results[k] = out
        self.seconds["generate"] += time.perf_counter() - started
        return [results[k] for k in range(len(pending))]

    def _generate_chunk(self, rows: list[tuple[int, _Turn]], cache: Any) -> list[TurnOutput]:
        import torch

        prompts = [turn.prompt.ids for _, turn in rows]
        prefix = _left_padded_cache(
            cache, [(row, len(ids) - 1) for (row, _), ids in zip(rows, prompts, strict=True)]
        )
        if prefix is None:
            self.stats["generated_without_cache"] += len(rows)
            return [generate_from(self.loaded, ids, self.max_new_tokens) for ids in prompts]
        width = max(len(ids) for ids in prompts)
        # Left padding, as for any batched ``generate``: every prompt ends at the same column, the
        # mask hides the padding and ``generate`` derives each row's positions from the mask.
        input_ids = torch.full((len(rows), width), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, ids in enumerate(prompts):
            input_ids[r, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[r, width - len(ids) :] = 1
        device = self.loaded.device
        with torch.inference_mode():
            out = self.loaded.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                num_beams=1,
                eos_token_id=list(self.loaded.stop_ids),
                pad_token_id=self.loaded.pad_id,
                output_logits=True,
                return_dict_in_generate=True,
                **{self._cache_kw: prefix},
            )
            steps = torch.stack([step.float() for step in out.logits], dim=1)  # rows x steps x V
            top = steps.topk(2, dim=-1).values
            margins = (top[..., 0] - top[..., 1]).cpu()
        sequences = out.sequences[:, width:].cpu()
        results = []
        for r, ids in enumerate(prompts):
            new = [int(t) for t in sequences[r]]
            # The steps that decided this row's output: up to and including its first stop.
            used = next((k + 1 for k, t in enumerate(new) if t in self._stop), len(new))
            if bool((margins[r, :used] < self.margin).any()):
                # A near tie in a batched, cached computation: the reference call decides it.
                self.stats["generated_reference_rerun"] += 1
                results.append(generate_from(self.loaded, ids, self.max_new_tokens))
            else:
                results.append(decode_new_tokens(self.loaded, new))
        return results


def _left_padded_cache(cache: Any, rows: list[tuple[int, int]]) -> Any:
    """A fresh ``DynamicCache`` with, for each ``(row, length)``, the first ``length`` cached
    positions of ``row`` of ``cache``, right-aligned (left padding with zeros, masked later).

    Only plain full-attention layers can be cut this way (a sliding-window layer keeps only
    its window; other cache kinds hold no per-position tensors): ``None`` otherwise, and the
    turns are generated from scratch by the reference call.
    """
    if cache is None or any(length < 1 for _, length in rows):
        return None
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    width = max(length for _, length in rows)
    data = []
    for layer in layers:
        keys, values = layer.keys, layer.values
        if keys is None or keys.dim() != 4 or keys.shape[-2] < width:
            return None
        # New tensors: the batch cache stays intact for the other turns (the copy-before-reuse
        # the transformers docs ask for).
        k = keys.new_zeros((len(rows), keys.shape[1], width, keys.shape[3]))
        v = values.new_zeros((len(rows), values.shape[1], width, values.shape[3]))
        for r, (row, length) in enumerate(rows):
            k[r, :, width - length :] = keys[row, :, :length]
            v[r, :, width - length :] = values[row, :, :length]
        data.append((k, v))
    return DynamicCache(data)


def _unique(scenarios: Iterable[Scenario]) -> list[Scenario]:
    seen: set[str] = set()
    out = []
    for s in scenarios:
        if s.id not in seen:
            seen.add(s.id)
            out.append(s)
    return out
