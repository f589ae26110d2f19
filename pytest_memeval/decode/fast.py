"""The fast decoder: one teacher-forced forward pass per scenario, ``generate`` only where needed.

Every assistant message is predicted from the teacher-forced history, so the prompt of turn
``k`` is a token prefix of the whole conversation (checked per scenario, see below). One
forward pass over the conversation therefore gives, at every position, the logits the
reference path's ``generate`` sees at its first step, and at the later answer positions the
logits it would see *if* it had produced the truth so far. Greedy decoding reproduces the
truth exactly when the argmax at each answer position is the truth token and the argmax after
it is a stop id; then the prediction is the truth, decoded as the reference decodes it. At
every other turn a verification pass (one batched cached forward pass over a guessed
continuation of the turn, see :meth:`FastDecoder._verify_many`) settles what it can, and
this decoder runs a real greedy ``generate`` for the rest from the prefix's key/value cache
(cropped out of the forward pass, so the history is not re-run).

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
import functools
import inspect
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_memeval.compat.attention import (
    attention_implementation,
    can_switch_attention,
    switched_attention,
)
from pytest_memeval.compat.transformers import dynamic_cache, full_attention_kv
from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.decode._types import Rollout, TurnOutput
from pytest_memeval.decode.batches import length_batches
from pytest_memeval.decode.reference import (
    decode_new_tokens,
    generate_from,
    prompt_tail,
    reference_rollout,
)
from pytest_memeval.model.loading import LoadedModel
from pytest_memeval.model.prefix import proven_scenario_prompts
from pytest_memeval.model.prompts import TurnPrompt

__all__ = [
    "DEFAULT_ACCELERATOR_BATCH_SIZE",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_MAX_BATCH_TOKENS",
    "FastDecoder",
    "default_margin",
]

#: Scenarios per forward pass (an upper bound; :data:`DEFAULT_MAX_BATCH_TOKENS` also applies),
#: by device kind. On CPU, eager attention over a wide batch cost more than batching saved (4
#: beat 1, 8 and 16); with the forward pass's causal sdpa (:data:`FORWARD_ATTENTION`) 4 to 16
#: cost the same and 32 twice as much (see ``docs/decoding.md``, "Forward-pass batches"): 8
#: keeps the scheduler's chunks under xdist small. Accelerators want wide batches.
DEFAULT_BATCH_SIZES: dict[str, int] = {"cpu": 8}
DEFAULT_ACCELERATOR_BATCH_SIZE = 16
#: Rows per batched ``generate`` call, and turns pooled over consecutive forward passes before
#: generating (``max_batch_tokens`` also bounds a call: rows x longest row). A generate step
#: feeds one token per row, so its cost is mostly per call and per step, not per row: on the
#: demo, 128 rows per call spend half the CPU time of 16.
GENERATE_ROWS = 128
#: Bytes of per-step logits one ``generate`` call may hold for the margin guard
#: (``output_logits``: rows x steps x vocabulary in fp32, and a stacked copy): fewer rows per
#: call where the vocabulary or ``max_new_tokens`` is large (Qwen's 151,936 tokens at 16
#: steps: 55 rows; the demo's 54 tokens: :data:`GENERATE_ROWS`).
GENERATE_LOGITS_BYTES = 1 << 30
#: Padded tokens per forward pass (batch rows x longest row), bounding activation memory.
DEFAULT_MAX_BATCH_TOKENS = 32768

#: The attention implementation of the fast path's forward passes, by the one the model was
#: loaded with (any other: unchanged), in the dtypes of :data:`FORWARD_ATTENTION_DTYPES`.
#: Eager attention materialises batch x heads x width^2 scores; sdpa without a padding mask
#: (see ``_decode_batch``) runs a causal kernel that does not. Measured on the demo (189
#: scenarios, fp32, 2 threads, forward passes alone, 2026-12-01): 0.73-0.88 s eager at batch
#: 4, 0.40-0.45 s sdpa at batch 4-16 (0.83 s at 32). A different computation of the same
#: logits: the calibration measures it (kinds ``first``/``step`` compare this pass's logits
#: with the reference call's, ``generate`` its cache's use) and the margin guard bounds it.
FORWARD_ATTENTION: dict[str, str] = {"eager": "sdpa"}
#: Where the switch applies: in 16-bit the guard counts ulps and assumes (PRIOR_ULPS) that the
#: forward pass and ``generate``'s prefill mostly agree bit for bit, which the same kernel
#: gives; another kernel there was not measured.
FORWARD_ATTENTION_DTYPES = frozenset({"float32", "float64"})

#: Bounds used where no measurement exists (a kind of decision the calibration did not see, or
#: ``calibrate=False``): the fixed margins of earlier releases, far above any disagreement
#: measured (see ``docs/decoding.md``). Top-1/top-2 logit margins in fp32 units, by model dtype.
MARGINS: dict[str, float] = {"float32": 1e-2, "float64": 1e-6, "float16": 0.25, "bfloat16": 1.0}

#: The smallest absolute bound, by dtype, where the calibration measured the disagreement: in
#: fp32 about 85x the largest disagreement measured on the demo (1.17e-5 at logits up to 15)
#: and 28x the bound it calibrates to; in 16-bit the bound is relative (below). Without a
#: measurement the fixed :data:`MARGINS` apply.
MIN_MARGINS: dict[str, float] = {"float32": 1e-3, "float64": 1e-6, "float16": 0.0, "bfloat16": 0.0}

#: Mantissa bits by dtype: a logit ``x`` is stored to one unit in the last place (ulp),
#: ``2 ** (floor(log2 |x|) - bits)``. 16-bit disagreement is counted in these units, since
#: it grows with the logit's magnitude.
MANTISSA_BITS: dict[str, int] = {"float32": 23, "float64": 52, "float16": 10, "bfloat16": 7}

#: The per-logit disagreement (in ulps of that logit) assumed possible in 16-bit even where a
#: calibration saw none, by kind of decision (:data:`KINDS`). Measured on the demo in
#: bfloat16 on CPU (2026-12-01, 620 positions): the teacher-forced pass and ``generate``'s
#: prefill agreed bit for bit at every prompt's last position; cached steps differed by up to
#: one ulp at about 2% of positions, which a small calibration sample can miss. Half an ulp
#: for ``first`` is the smallest difference rounding to the dtype can leave.
PRIOR_ULPS: dict[str, dict[str, float]] = {
    dtype: {"first": 0.5, "step": 1.0, "generate": 1.0, "verify": 1.0}
    for dtype in ("float16", "bfloat16")
}

#: Bound = SAFETY x (largest top-1/top-2 change the disagreement allows, i.e. twice the
#: largest per-logit difference), never below :data:`MIN_MARGINS`. In 16-bit, margins are
#: multiples of an ulp, so a factor of 1.5 makes "at least the bound" mean "more than twice
#: the disagreement" (at one ulp: three ulps): a margin of exactly 2d could become a tie.
SAFETY = 1.5

#: Turns whose logits the calibration compares with the reference computation (once per
#: decoder, on its first batch; their outputs are the reference call's).
CALIBRATION_TURNS = 12

#: The kinds of greedy decision the fast path relies on, each compared with the reference
#: computation it stands in for: ``first``: the teacher-forced logits at a prompt's last
#: position vs ``generate``'s prefill; ``step``: teacher-forced logits at later answer
#: positions vs ``generate``'s cached steps; ``generate``: the fast path's batched generation
#: from the cropped cache vs ``generate``'s steps on the full prompt; ``verify``: the
#: verification pass (one cached multi-token forward pass over a guessed continuation, see
#: :meth:`FastDecoder._verify_many`) vs ``generate``'s steps on the full prompt.
KINDS = ("first", "step", "generate", "verify")

#: Rounds of the verification pass per pool of turns: each round checks a guessed
#: continuation of every still-open turn in one batched cached forward pass; what it cannot
#: settle continues from the longer draft in the next round, then in ``generate``.
VERIFY_ROUNDS = 3

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
    """The bound used for ``dtype`` where nothing was measured (see :data:`MARGINS`)."""
    return MARGINS.get(dtype, MARGINS["bfloat16"])


def ulp(value: float, dtype: str) -> float:
    """One unit in the last place of ``value`` stored in ``dtype``."""
    _, exponent = math.frexp(abs(value) or 1.0)  # |value| = m * 2**exponent, 0.5 <= m < 1
    return 2.0 ** (exponent - 1 - MANTISSA_BITS.get(dtype, 7))


def calibrated_bound(
    dtype: str,
    kind: str,
    disagreements: Sequence[float],
    disagreement_ulps: Sequence[float],
    device_type: str = "cpu",
) -> tuple[float, float]:
    """``(absolute, ulps)`` bound for one kind of decision from the measured per-position
    maxima of ``|fast logit - reference logit|`` (absolute and in ulps of each logit).

    Two logits each off by at most ``d`` move the top-1/top-2 gap by at most ``2 d``: a
    decision is trusted when its margin is at least :data:`SAFETY` times that. In 16-bit the
    bound is counted in ulps of the decision's top logit, with ``d`` at least
    :data:`PRIOR_ULPS`. In fp32/fp64 it is absolute, never below the floor:
    :data:`MIN_MARGINS` on the CPU, where it was measured, and the fixed :data:`MARGINS` on
    any other device (not measured there: accelerator kernels choose their reductions by
    shape). Without measurements in fp32: :func:`default_margin`.
    """
    if dtype in PRIOR_ULPS:
        d = max([PRIOR_ULPS[dtype][kind], *disagreement_ulps])
        return MIN_MARGINS.get(dtype, 0.0), SAFETY * 2.0 * d
    if not disagreements:
        return default_margin(dtype), 0.0
    floors = MIN_MARGINS if device_type == "cpu" else MARGINS
    floor = floors.get(dtype, floors["float32"])
    return max(floor, SAFETY * 2.0 * max(disagreements)), 0.0


def summarize(values: Sequence[float], quantile: float = 0.99) -> tuple[float, float]:
    """``(max, quantile)`` of ``values`` (nearest rank); ``(nan, nan)`` when empty."""
    if not values:
        return math.nan, math.nan
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))
    return ordered[-1], ordered[rank]


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

    ``forward_attention``: the attention implementation of the forward passes (``"auto"``:
    :data:`FORWARD_ATTENTION`; ``None``: the one the model was loaded with); ``generate``
    always runs with the model's own.
    """

    path = "fast"

    @property
    def margin(self) -> float:
        """The smallest absolute bound in use (:attr:`bounds` and :attr:`bounds_ulps` have
        each kind's)."""
        return min(self.bounds.values())

    def _trusted(self, kind: str, margin: float, top: float) -> bool:
        """Whether a greedy decision with this top-1/top-2 ``margin`` and top logit ``top``
        is far enough from a tie that the reference computation makes it too."""
        bound = self.bounds[kind]
        if self.bounds_ulps[kind]:
            bound = max(bound, self.bounds_ulps[kind] * ulp(top, self.loaded.dtype))
        return margin >= bound

    def __init__(
        self,
        loaded: LoadedModel,
        max_new_tokens: int,
        *,
        batch_size: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        margin: float | None = None,
        calibrate: bool | None = None,
        calibration_turns: int = CALIBRATION_TURNS,
        forward_attention: str | None = "auto",
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
        #: the bound for each kind of decision (:data:`KINDS`): ``margin`` for all of them if
        #: given, else :func:`default_margin` until the calibration on the first batch
        #: replaces it with :func:`calibrated_bound`
        fixed = default_margin(loaded.dtype) if margin is None else float(margin)
        self.bounds: dict[str, float] = dict.fromkeys(KINDS, fixed)
        #: measured per-position maxima of |fast logit - reference logit|, by kind
        self.disagreement: dict[str, list[float]] = {kind: [] for kind in KINDS}
        #: the same in ulps of each logit (see :func:`ulp`)
        self.disagreement_ulps: dict[str, list[float]] = {kind: [] for kind in KINDS}
        #: relative part of the bounds (16-bit): a decision also needs a margin of at least
        #: this many ulps of its top logit
        self.bounds_ulps: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        self._calibrate = (margin is None) if calibrate is None else calibrate
        self._calibrate_bounds = margin is None
        self.calibration_turns = calibration_turns
        #: what the calibration was measured with (:meth:`_calibration_setting`), once it was
        self.calibrated_on: dict[str, Any] | None = None
        self.stats: Counter[str] = Counter()
        #: seconds spent building prompts, in forward passes and in ``generate``
        self.seconds: dict[str, float] = defaultdict(float)
        self._ready: dict[str, Rollout] = {}
        self._decoded: dict[tuple[int, ...], TurnOutput] = {}
        #: answers seen (truth token sequences), and the answers each proper prefix starts
        #: (guesses for the verification pass)
        self._answer_counts: Counter[tuple[int, ...]] = Counter()
        self._answers_by_prefix: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
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
        if forward_attention == "auto":
            wanted = FORWARD_ATTENTION.get(attention_implementation(loaded.model) or "")
            forward_attention = (
                wanted
                if wanted is not None
                and loaded.dtype in FORWARD_ATTENTION_DTYPES
                and can_switch_attention(loaded.model, wanted)
                else None
            )
        #: the attention implementation of the forward passes (``None``: the model's own)
        self.forward_attention = forward_attention
        self._unsafe = unsafe_generation_settings(getattr(loaded.model, "generation_config", None))

    def adopt_calibration(self, other: FastDecoder) -> bool:
        """Take ``other``'s calibration (its measured disagreement, and the bounds computed
        from it) instead of calibrating: for another decoder of the same loaded model (same
        weights, dtype, device and attention implementation, which is what the disagreement
        depends on), e.g. ``memeval bench``'s growth table after its main run. A decoder given
        a ``margin`` keeps it. False (nothing adopted) when ``other`` measured nothing."""
        if other.loaded.model is not self.loaded.model:
            raise ValueError("a calibration is only valid for the model it was measured on")
        if not other.stats["calibration_turns"]:
            return False
        # The same model object can have changed in place since (another adapter active,
        # another attention implementation, dtype or device), and the batch settings shape
        # the batched computations measured: all must be what they were at calibration.
        mine, theirs = self._calibration_setting(), other.calibrated_on or {}
        differ = sorted(k for k in mine if mine[k] != theirs.get(k))
        if differ:
            raise ValueError(
                "a calibration is only valid for the settings it was measured with; "
                f"these differ: {', '.join(differ)}"
            )
        for kind in KINDS:
            self.disagreement[kind] = list(other.disagreement[kind])
            self.disagreement_ulps[kind] = list(other.disagreement_ulps[kind])
        self._set_bounds()
        self._calibrate = False
        return True

    def _set_bounds(self) -> None:
        """Each kind's bound from what was measured (a decoder given a ``margin`` keeps it)."""
        if not self._calibrate_bounds:
            return
        for kind in KINDS:
            self.bounds[kind], self.bounds_ulps[kind] = calibrated_bound(
                self.loaded.dtype,
                kind,
                self.disagreement[kind],
                self.disagreement_ulps[kind],
                self._device_type,
            )

    @property
    def _device_type(self) -> str:
        return str(self.loaded.device).split(":")[0]

    def _calibration_setting(self) -> dict[str, Any]:
        """What a measured disagreement depends on besides the weights."""
        model = self.loaded.model
        adapters: Any = None
        if hasattr(model, "get_base_model"):  # a peft model: which of its adapters is active
            # peft's PeftModel.active_adapters (a property; public). A plain transformers model
            # has a method of that name that raises without a recent peft: not asked.
            adapters = getattr(model, "active_adapters", None)
        return {
            "dtype": self.loaded.dtype,
            "device": str(self.loaded.device),
            "attention": attention_implementation(model),
            "forward_attention": self.forward_attention,
            "adapters": tuple(adapters) if isinstance(adapters, (list, tuple)) else adapters,
            "batch_size": self.batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "max_new_tokens": self.max_new_tokens,
        }

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
        # Longest first, similar lengths together (see ``batches.py``).
        # The turns the forward passes do not settle are pooled over consecutive batches and
        # generated together: a generate step costs about the same for 4 rows as for 64, so
        # fewer, fuller calls (each forward pass's cache is kept until its turns are done).
        held: list[tuple[list[tuple[int, _Plan]], list[list[TurnOutput | None]]]] = []
        pool: list[_Pending] = []
        held_tokens = 0
        for batch in self._batches(plans):
            outputs, pending = self._decode_batch([p for _, p in batch])
            for item in pending:
                item.batch = len(held)
            held.append((batch, outputs))
            pool.extend(pending)
            held_tokens += len(batch) * max(len(p.full) for _, p in batch)
            if len(pool) >= self._generate_rows_cap or held_tokens >= self.max_batch_tokens:
                self._finish(held, pool, results)
                held, pool, held_tokens = [], [], 0
        self._finish(held, pool, results)
        return [results[i] for i in range(len(scenarios))]

    @functools.cached_property
    def _generate_rows_cap(self) -> int:
        """Rows per batched ``generate`` call (and turns pooled before generating): at most
        :data:`GENERATE_ROWS`, and at most what keeps the call's logits within
        :data:`GENERATE_LOGITS_BYTES`. Read once: the pool checks it after every batch."""
        per_row = self.max_new_tokens * max(1, self._vocab_size) * 4 * 2
        return max(1, min(GENERATE_ROWS, GENERATE_LOGITS_BYTES // per_row))

    @property
    def _vocab_size(self) -> int:
        """Logits per position (the output embedding's rows; the config's ``vocab_size``
        where the model has no output embedding to read)."""
        model = self.loaded.model
        embeddings = (
            model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        )
        weight = getattr(embeddings, "weight", None)
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
            return int(weight.shape[0])
        return int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)

    def _finish(
        self,
        held: list[tuple[list[tuple[int, _Plan]], list[list[TurnOutput | None]]]],
        pool: list[_Pending],
        results: dict[int, Rollout],
    ) -> None:
        """Settle the pooled turns (verification pass, then ``generate`` for the rest), then
        complete the rollouts of the held batches."""
        for batch, _ in held:
            for _, plan in batch:
                self._learn_answers(plan)
        self.stats["generated"] += len(pool)
        self.stats["draft_tokens"] += sum(len(p.draft) for p in pool)
        settled = self._verify_many(pool)
        rest = [p for p, out in zip(pool, settled, strict=True) if out is None]
        for item, out in zip(pool, settled, strict=True):
            if out is not None:
                held[item.batch][1][item.row][item.turn_no] = out
        for item, generated in zip(rest, self._generate_many(rest), strict=True):
            held[item.batch][1][item.row][item.turn_no] = generated
        for batch, outputs in held:
            for (pos, plan), row in zip(batch, outputs, strict=True):
                done = tuple(o for o in row if o is not None)
                assert len(done) == len(plan.turns)
                tail = prompt_tail(self.loaded, plan.turns[-1].prompt.ids)
                results[pos] = Rollout(
                    done, self.path, tail, batch=len(batch), batch_size=self.batch_size
                )

    def _batches(self, plans: list[tuple[int, _Plan]]) -> list[list[tuple[int, _Plan]]]:
        """``plans`` in forward passes of similar lengths (:func:`~.batches.length_batches`)."""
        groups = length_batches(
            [len(p.full) for _, p in plans], self.batch_size, self.max_batch_tokens
        )
        return [[plans[i] for i in group] for group in groups]

    def _plan(self, scenario: Scenario) -> tuple[_Plan | None, list[TurnPrompt], str]:
        """The scenario's teacher-forced plan, or ``None`` and why the fast path cannot hold."""
        tokenizer = self.loaded.tokenizer
        started = time.perf_counter()
        # The same ids as ``prompts.scenario_prompts``; most prompts' ids are proven to be
        # the conversation's prefix without tokenising them (see ``model/prefix.py``).
        prompts, full, proven = proven_scenario_prompts(tokenizer, scenario)
        self.stats["prompts_proven"] += proven
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
        self.stats["reference_scenario_turns"] += len(prompts)
        self.stats["turns"] += len(prompts)
        self.stats["generated"] += len(prompts)
        started = time.perf_counter()
        rollout = reference_rollout(self.loaded, prompts, self.max_new_tokens, self.path, (note,))
        self.seconds["generate"] += time.perf_counter() - started
        return rollout

    def _decode_batch(
        self, plans: list[_Plan]
    ) -> tuple[list[list[TurnOutput | None]], list[_Pending]]:
        """One forward pass over ``plans``: each turn's output where the forward pass decides
        it (``None`` elsewhere), and the turns left to generate (holding the pass's cache)."""
        # Deferred: torch takes seconds to import; only a model run needs it.
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
        # No padding mask: rows are right-padded and attention is causal, so a real position
        # only ever sees real positions before it; the padding's outputs are never read (no
        # logit is kept there, no generate reuses its cache). Without a mask, sdpa runs its
        # causal kernel instead of materialising batch x heads x width^2 scores.
        kwargs: dict[str, Any] = {"use_cache": True}
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
        with torch.inference_mode(), switched_attention(self.loaded.model, self.forward_attention):
            out = self.loaded.model(input_ids=ids.to(device), **kwargs)
            # Argmax and margins in fp32, as ``generate`` upcasts its next-token logits and
            # takes ``argmax`` (so exact ties break the same way).
            logits = out.logits.float()
            best = logits.argmax(-1).cpu()
            top = logits.topk(2, dim=-1).values
            margin = (top[..., 0] - top[..., 1]).cpu()
            top1 = top[..., 0].cpu()
        self.seconds["forward"] += time.perf_counter() - started
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        del out
        outputs: list[list[TurnOutput | None]] = [[None] * len(p.turns) for p in plans]
        if self._calibrate:
            self._calibrate = False
            started = time.perf_counter()
            self._calibration(plans, logits, column, cache)
            self.seconds["calibration"] += time.perf_counter() - started
        del logits
        pending: list[_Pending] = []
        # Plain lists: the per-position checks below index them thousands of times.
        checks = (best.tolist(), margin.tolist(), top1.tolist())
        for row, plan in enumerate(plans):
            for n, turn in enumerate(plan.turns):
                self.stats["turns"] += 1
                decided = self._teacher_forced(row, turn, checks, column)
                if isinstance(decided, TurnOutput):
                    outputs[row][n] = decided
                else:
                    pending.append(_Pending(row, n, turn, decided, cache))
        return outputs, pending

    def _teacher_forced(
        self,
        row: int,
        turn: _Turn,
        checks: tuple[list[list[int]], list[list[float]], list[list[float]]],
        column: dict[int, int],
    ) -> TurnOutput | tuple[int, ...]:
        """The turn's output if the forward pass proves what greedy decoding yields; else the
        draft: the tokens greedy decoding is proven to produce first (the truth up to where
        the model leaves it, plus the model's own token there when that decision is clear)."""
        if not turn.expected:
            self.stats["generated_no_truth"] += 1
            return ()
        best, margin, top = checks
        start = len(turn.prompt.ids)
        produced: list[int] = []
        for j, want in enumerate(turn.expected):
            col = column[start - 1 + j]
            got = best[row][col]
            kind = "first" if j == 0 else "step"
            if not self._trusted(kind, margin[row][col], top[row][col]):
                self.stats["generated_near_tie"] += 1
                return tuple(produced)
            produced.append(got)
            last_stop = turn.ends_with_stop and j == len(turn.expected) - 1
            # Any stop id ends the turn the same way; elsewhere only the truth token will do.
            if got != want and not (last_stop and got in self._stop):
                self.stats["generated_mismatch"] += 1
                if got in self._stop or len(produced) >= self.max_new_tokens:
                    # The model's own token ends the turn: the forward pass decided it all.
                    self.stats["forward_only"] += 1
                    return self._forward_output(produced)
                return tuple(produced)
        self.stats["teacher_forced"] += 1
        return self._forward_output(produced)

    def _forward_output(self, tokens: Sequence[int]) -> TurnOutput:
        """``decode_new_tokens`` of tokens the forward pass decided (``generated: False``),
        memoised: the same answers recur across turns and scenarios, and decoding is a pure
        function of the tokens."""
        key = tuple(tokens)
        out = self._decoded.get(key)
        if out is None:
            out = dataclasses.replace(decode_new_tokens(self.loaded, key), generated=False)
            self._decoded[key] = out
        return out

    def _calibration(
        self, plans: list[_Plan], logits: Any, column: dict[int, int], cache: Any
    ) -> None:
        """Measure how far the fast path's logits are from the reference computation's.

        For up to :attr:`calibration_turns` turns of this batch (spread over its rows and
        turns), run the reference call (``generate`` on the full prompt, as the reference
        path does) with its logits, and compare them, position by position while it follows
        the truth, with the teacher-forced logits (kinds ``first`` and ``step``), and with the
        fast path's cached batched generation of the same turns (kind ``generate``). The
        bounds become :func:`calibrated_bound` of what was measured. The turns are then
        decoded like any other (so how a turn was decided does not depend on which turns a
        process happened to calibrate on).
        """
        # Per row, turns from both ends inwards (the longest prompt first, then the shortest,
        # ...), taking one turn from each row in turn.
        orders = []
        for plan in plans:
            turns = [n for n, t in enumerate(plan.turns) if t.expected]
            orders.append(
                [turns[-1 - k // 2] if k % 2 == 0 else turns[k // 2] for k in range(len(turns))]
            )
        picked: list[tuple[int, int]] = []
        depth = 0
        while len(picked) < self.calibration_turns and any(depth < len(o) for o in orders):
            for row, order in enumerate(orders):
                if depth < len(order) and len(picked) < self.calibration_turns:
                    picked.append((row, order[depth]))
            depth += 1
        references: list[tuple[list[int], Any]] = []
        for row, n in picked:
            turn = plans[row].turns[n]
            new, steps = self._reference_steps(turn.prompt.ids)
            references.append((new, steps))
            start = len(turn.prompt.ids)
            for j, step in enumerate(steps):
                if j >= len(turn.expected) or new[:j] != list(turn.expected[:j]):
                    break  # the reference left the truth: later logits are not comparable
                self._measure(
                    "first" if j == 0 else "step", logits[row, column[start - 1 + j]], step
                )
        generated = (
            self._generate_rows(
                [(cache, row, 0, plans[row].turns[n].prompt.ids, 0) for row, n in picked], True
            )
            if picked
            else None
        )
        if generated is not None:
            for (new, steps), (fast_new, fast_steps) in zip(references, generated, strict=True):
                for j, (a, b) in enumerate(zip(fast_steps, steps, strict=False)):
                    if new[:j] != fast_new[:j]:
                        break
                    self._measure("generate", a, b)
        if picked:
            # The verification pass over the reference's own tokens: at position k it sees
            # the prompt and the reference's first k tokens, as the reference's step k did.
            fed_rows = []
            for (row, n), (new, steps) in zip(picked, references, strict=True):
                ids = plans[row].turns[n].prompt.ids
                fed_rows.append((cache, row, 0, len(ids) - 1, [ids[-1], *new[: len(steps) - 1]]))
            # Both computations the verification pass uses: packed (first round) and cut.
            for verified in (
                self._verify_packed(fed_rows, True),
                self._verify_rows(fed_rows, True),
            ):
                if verified is None:
                    continue
                for (_, steps), fast_steps in zip(references, verified[2], strict=True):
                    for a, b in zip(fast_steps, steps, strict=True):
                        self._measure("verify", a, b)
        self.stats["calibration_turns"] += len(picked)
        self.calibrated_on = self._calibration_setting()
        self._set_bounds()

    def _measure(self, kind: str, fast: Any, reference: Any) -> None:
        """Record how far two computations of one position's logits are apart."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        # On the CPU: the fast path's and the reference's logits may sit on different devices.
        fast, reference = fast.float().cpu(), reference.float().cpu()
        delta = (fast - reference).abs()
        self.disagreement[kind].append(float(delta.max()))
        # In ulps as stored in the model dtype: of the logit itself, or of the top logit when
        # that is larger (the bound is counted in ulps of the top logit; a small logit far
        # below the top does not decide anything and must not inflate the count).
        top = float(torch.maximum(fast.max(), reference.max()).abs())
        magnitude = torch.maximum(fast.abs(), reference.abs()).clamp_min(max(top, 2.0**-24))
        bits = MANTISSA_BITS.get(self.loaded.dtype, 7)
        units = torch.exp2(torch.floor(torch.log2(magnitude)) - bits)
        self.disagreement_ulps[kind].append(float((delta / units).max()))

    def _greedy_kwargs(self) -> dict[str, Any]:
        """``generate`` settings both of this path's generate calls share (greedy, the
        reference's stop ids, logits returned for the margin guard)."""
        return {
            "do_sample": False,
            "num_beams": 1,
            "eos_token_id": list(self.loaded.stop_ids),
            "pad_token_id": self.loaded.pad_id,
            "output_logits": True,
            "return_dict_in_generate": True,
        }

    def _reference_steps(self, ids: Sequence[int]) -> tuple[list[int], list[Any]]:
        """The reference call on ``ids`` (as :func:`~.reference.generate_from`), with its
        per-step fp32 logits."""
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.loaded.device)
        with torch.inference_mode():
            out = self.loaded.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=self.max_new_tokens,
                **self._greedy_kwargs(),
            )
        new = [int(t) for t in out.sequences[0, input_ids.shape[1] :]]
        return new, [step[0].float() for step in out.logits]

    def _used(self, new: Sequence[int]) -> list[int]:
        """Generated tokens up to and including the first stop id."""
        used = next((k + 1 for k, t in enumerate(new) if t in self._stop), len(new))
        return list(new[:used])

    def _chunks(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of rows (longest first) in chunks for one batched call each: at most
        :attr:`_generate_rows_cap` rows, rows x longest row at most ``max_batch_tokens``."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        chunks: list[list[int]] = []
        # A generate step feeds one token per row: rows are cheap, calls are not. Equal
        # shares (139 turns: 70 + 69, not 128 + 11): every call runs as many steps as its
        # slowest row, whatever its size.
        calls = max(1, math.ceil(len(lengths) / self._generate_rows_cap))
        rows_cap = math.ceil(len(lengths) / calls)
        for i in order:
            chunk = chunks[-1] if chunks else []
            width = lengths[chunk[0]] if chunk else 0
            if (
                chunk
                and len(chunk) < rows_cap
                and (len(chunk) + 1) * width <= self.max_batch_tokens
            ):
                chunk.append(i)
            else:
                chunks.append([i])
        return chunks

    def _learn_answers(self, plan: _Plan) -> None:
        """Index the plan's answers (truth token sequences) by their prefixes: the
        verification pass guesses that a turn which left its truth says another answer of
        the benchmark that starts as the turn's draft does."""
        for turn in plan.turns:
            answer = turn.expected
            if not answer:
                continue
            if answer not in self._answer_counts:
                for length in range(1, len(answer)):
                    self._answers_by_prefix.setdefault(answer[:length], set()).add(answer)
            self._answer_counts[answer] += 1

    def _guess(self, item: _Pending) -> tuple[int, ...]:
        """The guessed continuation of ``item``'s draft: the most frequent known answer that
        starts with the draft, else the truth from the draft's length on (a wrong word in an
        otherwise right answer); cut after a stop id and to the token budget. Only a guess:
        the verification pass accepts nothing the model does not produce itself."""
        draft = item.draft
        known = self._answers_by_prefix.get(draft)
        if known:
            best = max(known, key=lambda a: (self._answer_counts[a], a))
            guess = best[len(draft) :]
        else:
            guess = item.turn.expected[len(draft) :]
        # Position i of the pass decides answer token len(draft) + i: the last useful one is
        # the max_new_tokens-th, so at most max_new_tokens - len(draft) - 1 guessed tokens.
        guess = guess[: max(0, self.max_new_tokens - len(draft) - 1)]
        stop = next((k + 1 for k, t in enumerate(guess) if t in self._stop), len(guess))
        return guess[:stop]

    def _verify_many(self, pool: list[_Pending]) -> list[TurnOutput | None]:
        """Settle what it can of ``pool`` with verification passes instead of ``generate``.

        Each pending turn whose draft ends with the model's own token (it left the truth with
        a clear margin) gets a guessed continuation (:meth:`_guess`); one batched cached
        forward pass over ``[last draft token, *guess]`` per chunk computes, at every guessed
        position, the logits greedy decoding sees if the guess is right so far. Greedy
        decoding is proven to produce each argmax whose margin clears the ``verify`` bound,
        as long as all earlier guessed tokens were produced: the longest such prefix is
        accepted, plus the model's own token where it leaves the guess. A turn whose accepted
        tokens reach a stop id or ``max_new_tokens`` is settled (as ``generate`` stops:
        :meth:`_used`); the others continue from the longer draft (next round, then
        ``generate``), with the pass's cache. Returns per turn its output or ``None``.
        """
        results: list[TurnOutput | None] = [None] * len(pool)
        started = time.perf_counter()
        # A draft that is a prefix of the truth ended at a near tie (or is empty): that
        # decision is ``generate``'s, as without the verification pass.
        open_rows = [
            i
            for i, p in enumerate(pool)
            if p.draft and p.draft != p.turn.expected[: len(p.draft)] and self._position_ids
        ]
        for _ in range(VERIFY_ROUNDS):
            # A draft grown by a packed pass is fed again from where its cache ends.
            work = [
                (i, g)
                for i in open_rows
                if (g := self._guess(pool[i])) or pool[i].held < pool[i].length - 1
            ]
            if not work:
                break
            open_rows = []
            fed_all = [
                (p.cache, p.cache_row, p.offset, p.held, [*p.unheld, *g])
                for p, g in ((pool[i], g) for i, g in work)
            ]
            # Packed passes read the forward passes' caches as they are (no copies); cut
            # passes, in chunks, only where they cannot.
            packed = self._verify_packed(fed_all, False)
            chunks = (
                [list(range(len(work)))]
                if packed is not None
                else self._chunks([pool[i].length + len(g) for i, g in work])
            )
            for chunk in chunks:
                rows = [work[k] for k in chunk]
                fed_rows = [fed_all[k] for k in chunk]
                verified = packed or self._verify_rows(fed_rows, False)
                if verified is None:
                    # The cache cannot be cut: ``generate`` decides (from the full prompt).
                    for item in pool:
                        if item.held < item.length - 1:
                            item.cache = None  # its cache lacks the grown draft
                    self.seconds["verify"] += time.perf_counter() - started
                    return results
                cache, starts, checks = verified
                for r, ((i, guess), start, (best, margin, top)) in enumerate(
                    zip(rows, starts, checks, strict=True)
                ):
                    item = pool[i]
                    # only the positions after the draft decide (the ones before re-feed a
                    # draft grown by a packed pass)
                    skip = len(best) - len(guess) - 1
                    self.stats["verify_refed"] += skip > 0
                    best, margin, top = best[skip:], margin[skip:], top[skip:]
                    accepted, settled, own = self._accept(item, guess, best, margin, top)
                    self.stats["verify_tokens"] += len(accepted)
                    if settled:
                        self.stats["verified"] += 1
                        # the guess accepted to its end (else the model's own stop ended it)
                        self.stats["verified_guess"] += list(guess) == accepted
                        self.stats["verified_at_budget"] += accepted[-1] not in self._stop
                        # ``generated``: the model left the truth here, whichever computation
                        # proved its answer (the pass or ``generate``: that depends on how
                        # turns were pooled, which must not change a record).
                        results[i] = dataclasses.replace(
                            self._forward_output([*item.draft, *accepted]), generated=True
                        )
                        continue
                    # left the guess: counted once per turn, whatever the round
                    self.stats["verify_left_guess"] += own and not item.grown
                    if accepted:
                        item.grown = True
                        item.draft = (*item.draft, *accepted)
                        if cache is not None:
                            item.cache, item.cache_row, item.offset = cache, r, start
                            item.held = item.length - 1
                        if own:
                            open_rows.append(i)
        self._refill([p for p, out in zip(pool, results, strict=True) if out is None])
        self.seconds["verify"] += time.perf_counter() - started
        return results

    def _refill(self, pending: list[_Pending]) -> None:
        """Give the turns whose drafts packed passes grew a cache holding their prompt and
        draft but its last token, for ``generate`` to continue from: one cut pass over the
        draft tokens the forward pass's cache lacks (its decisions unused)."""
        short = [p for p in pending if p.held < p.length - 1]
        for chunk in self._chunks([p.length for p in short]):
            rows = [short[k] for k in chunk]
            verified = self._verify_rows(
                [(p.cache, p.cache_row, p.offset, p.held, p.unheld[:-1]) for p in rows], False
            )
            for r, p in enumerate(rows):
                if verified is None:
                    p.cache = None  # ``generate`` from the full prompt
                    continue
                p.cache, p.cache_row, p.offset = verified[0], r, verified[1][r]
                p.held = p.length - 1

    def _accept(
        self,
        item: _Pending,
        guess: Sequence[int],
        best: Sequence[int],
        margin: Sequence[float],
        top: Sequence[float],
    ) -> tuple[list[int], bool, bool]:
        """What one row of a verification pass proves: ``(tokens greedy decoding produces
        after the draft, whether they end the turn, whether the last is the model's own
        token where it left the guess)``. Position ``k`` of the pass (after the draft and
        ``guess[:k]``) counts only while every earlier position produced its guessed token."""
        accepted: list[int] = []
        for k in range(len(guess) + 1):
            if not self._trusted("verify", margin[k], top[k]):
                # A near tie: not decided here; ``generate`` decides it (with its own guard).
                return accepted, False, False
            got = best[k]
            accepted.append(got)
            if got in self._stop or len(item.draft) + len(accepted) >= self.max_new_tokens:
                # Where greedy ``generate`` stops: the first stop id, or the token budget
                # (counted from the answer's start, the draft included).
                return accepted, True, False
            if k == len(guess) or got != guess[k]:
                return accepted, False, True
        raise AssertionError("unreachable: the last position always returns")

    def _verify_rows(
        self, rows: Sequence[tuple[Any, int, int, int, Sequence[int]]], full_logits: bool
    ) -> tuple[Any, list[int], list[Any]] | None:
        """One batched cached forward pass: for each ``(cache, row, offset, cut, fed)``, the
        ``cut`` positions of row ``row`` of ``cache`` from column ``offset`` on, then the
        tokens ``fed``.

        The cut caches are right-aligned (left padding, as for ``generate``), the fed tokens
        start at the same column for every row (right padding after them); the mask hides
        both paddings and each row's positions continue from its own length, as
        ``generate`` numbers them. Returns the pass's cache, the column where each row's
        tokens start in it, and per row, per fed token, its fp32 logits (``full_logits``)
        or ``(argmax, top-1/top-2 margin, top logit)`` lists; ``None`` when the cache cannot
        be cut (see :func:`_left_padded_cache`).
        """
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        prefix = _left_padded_cache([(c, r, offset, cut) for c, r, offset, cut, _ in rows])
        if prefix is None or not self._position_ids:
            return None
        self.stats["verify_passes"] += 1
        width = max(cut for _, _, _, cut, _ in rows)
        span = max(len(fed) for *_, fed in rows)
        input_ids = torch.full((len(rows), span), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width + span), dtype=torch.long)
        positions = torch.zeros((len(rows), span), dtype=torch.long)
        for r, (_, _, _, cut, fed) in enumerate(rows):
            input_ids[r, : len(fed)] = torch.tensor(list(fed), dtype=torch.long)
            mask[r, width - cut : width + len(fed)] = 1
            # Padding after the fed tokens gets the next positions: masked, never attended to.
            positions[r] = torch.arange(cut, cut + span)
        device = self.loaded.device
        with torch.inference_mode():
            out = self.loaded.model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                **{self._cache_kw: prefix},
            )
            # In fp32, as ``generate`` upcasts its next-token logits before the argmax.
            logits = out.logits.float()
            if full_logits:
                per_row: list[Any] = [
                    logits[r, : len(fed)].cpu() for r, (*_, fed) in enumerate(rows)
                ]
            else:
                best = logits.argmax(-1).cpu().tolist()
                top = logits.topk(2, dim=-1).values
                margin = (top[..., 0] - top[..., 1]).cpu().tolist()
                top1 = top[..., 0].cpu().tolist()
                per_row = [
                    (best[r][: len(fed)], margin[r][: len(fed)], top1[r][: len(fed)])
                    for r, (*_, fed) in enumerate(rows)
                ]
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        starts = [width - cut for _, _, _, cut, _ in rows]
        return cache, starts, per_row

    def _verify_packed(
        self, rows: Sequence[tuple[Any, int, int, int, Sequence[int]]], full_logits: bool
    ) -> tuple[None, list[int], list[Any]] | None:
        """What :meth:`_verify_rows` computes for the same ``(cache, row, 0, cut, fed)``,
        without cutting any cache: one forward pass over the cache as it is (rows of several
        caches: see :func:`_packed_source`), each of its rows fed the ``fed`` tokens of all
        the turns it holds one after another (a packed row). A 4D mask lets turn ``a``'s
        tokens see the cache's first ``cut_a`` columns and its own earlier fed tokens only,
        at positions ``cut_a + k``: the keys and values a cut cache would hold, with none of
        its copies. The pass's cache (the forward pass's plus the packed tokens) is not
        kept: ``(None, starts, per-row checks)``, or ``None`` when the caches are not plain
        full-attention ones.
        """
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        if not self._position_ids or not rows:
            return None
        for _, _, offset, cut, fed in rows:
            if offset != 0 or cut < 1 or not fed:
                return None
        source = _packed_source([(cache, row, cut) for cache, row, _, cut, _ in rows])
        if source is None:
            return None
        layers, slot_of = source
        batch, width = layers[0][0].shape[0], layers[0][0].shape[-2]
        members = range(len(rows))
        by_row: dict[int, list[int]] = {}
        for n in members:
            by_row.setdefault(slot_of[n], []).append(n)
        per_row: list[Any] = [None] * len(rows)
        device = self.loaded.device
        span = max(sum(len(rows[n][4]) for n in ns) for ns in by_row.values())
        ids = [[self.loaded.pad_id] * span for _ in range(batch)]
        cuts = [[0] * span for _ in range(batch)]
        # which turn each fed token belongs to (-1: padding)
        owner = [[-1] * span for _ in range(batch)]
        positions = [[0] * span for _ in range(batch)]
        where: dict[int, tuple[int, int]] = {}
        for row, ns in by_row.items():
            pos = 0
            for n in ns:
                cut, fed = rows[n][3], rows[n][4]
                where[n] = (row, pos)
                for k, token in enumerate(fed):
                    ids[row][pos + k] = token
                    cuts[row][pos + k] = cut
                    owner[row][pos + k] = n
                    positions[row][pos + k] = cut + k
                pos += len(fed)
        cut_t = torch.tensor(cuts, dtype=torch.long)
        owner_t = torch.tensor(owner, dtype=torch.long)
        step = torch.arange(span)
        # batch x query x key: the cache's first ``cut`` columns, then the same turn's fed
        # tokens up to the query itself
        allowed = torch.cat(
            [
                torch.arange(width)[None, None, :] < cut_t[:, :, None],
                (owner_t[:, :, None] == owner_t[:, None, :])
                & (owner_t[:, :, None] >= 0)
                & (step[None, None, :] <= step[None, :, None]),
            ],
            dim=-1,
        )
        # Padding queries see column 0 (never read; no row of the softmax all masked).
        allowed[..., 0] |= owner_t < 0
        dtype = layers[0][0].dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        self.stats["verify_passes"] += 1
        self.stats["verify_packed_passes"] += 1
        with torch.inference_mode():
            out = self.loaded.model(
                input_ids=torch.tensor(ids, dtype=torch.long).to(device),
                attention_mask=mask[:, None].to(device),
                position_ids=torch.tensor(positions, dtype=torch.long).to(device),
                use_cache=True,
                # a new cache object over the same tensors: its update concatenates into
                # new ones, so the forward pass's cache stays as later turns need it
                **{self._cache_kw: dynamic_cache(layers)},
            )
            # In fp32, as ``generate`` upcasts its next-token logits before the argmax.
            logits = out.logits.float()
            del out
            if full_logits:
                for n in members:
                    row, pos = where[n]
                    per_row[n] = logits[row, pos : pos + len(rows[n][4])].cpu()
            else:
                best = logits.argmax(-1).cpu().tolist()
                top = logits.topk(2, dim=-1).values
                margin = (top[..., 0] - top[..., 1]).cpu().tolist()
                top1 = top[..., 0].cpu().tolist()
                for n in members:
                    row, pos = where[n]
                    end = pos + len(rows[n][4])
                    per_row[n] = (
                        best[row][pos:end],
                        margin[row][pos:end],
                        top1[row][pos:end],
                    )
        return None, [0] * len(rows), per_row

    def _generate_many(self, pending: list[_Pending]) -> list[TurnOutput]:
        """Greedy ``generate`` for these turns, batched, continuing each from its draft with
        the cached keys/values of its prompt and draft (cut out of the forward pass)."""
        if not pending:
            return []
        self.stats["generate_turns"] += len(pending)
        self.stats["generate_grown_drafts"] += sum(p.grown for p in pending)
        started = time.perf_counter()
        results: dict[int, TurnOutput] = {}
        for chunk in self._chunks([p.length for p in pending]):
            outs = self._generate_chunk([pending[k] for k in chunk])
            results.update(zip(chunk, outs, strict=True))
        self.seconds["generate"] += time.perf_counter() - started
        return [results[k] for k in range(len(pending))]

    def _generate_chunk(self, rows: list[_Pending]) -> list[TurnOutput]:
        self.stats["generate_calls"] += 1
        generated = self._generate_rows(
            [
                (p.cache, p.cache_row, p.offset, [*p.turn.prompt.ids, *p.draft], len(p.draft))
                for p in rows
            ],
            False,
        )
        if generated is None:
            self.stats["generated_without_cache"] += len(rows)
            return [
                generate_from(self.loaded, p.turn.prompt.ids, self.max_new_tokens) for p in rows
            ]
        results = []
        for p, (new, steps) in zip(rows, generated, strict=True):
            # Only this row's budget counts (rows continue from drafts of different lengths),
            # and only the steps that decided its output: up to and including its first stop.
            used = self._used(new[: self.max_new_tokens - len(p.draft)])
            if not all(
                self._trusted("generate", float(m[0]), float(m[1])) for m in steps[: len(used)]
            ):
                # A near tie in a batched, cached computation: the reference call decides it.
                self.stats["generated_reference_rerun"] += 1
                results.append(generate_from(self.loaded, p.turn.prompt.ids, self.max_new_tokens))
            else:
                results.append(decode_new_tokens(self.loaded, [*p.draft, *used]))
        return results

    def _generate_rows(
        self, rows: list[tuple[Any, int, int, Sequence[int], int]], full_logits: bool
    ) -> list[tuple[list[int], list[Any]]] | None:
        """One batched greedy ``generate``: for each ``(cache, row, offset, ids, drafted)``,
        continue ``ids`` (a prompt plus ``drafted`` tokens already decided) with the
        ``len(ids) - 1`` positions of row ``row`` of ``cache`` from column ``offset`` on;
        only the last token and the new ones are computed.

        Returns per row the new tokens and, per step, the fp32 logits (``full_logits``) or
        the top-1/top-2 margin; ``None`` when the cache cannot be cut (see
        :func:`_left_padded_cache`).
        """
        # Deferred: torch takes seconds to import; only a model run needs it.
        import torch

        prefix = _left_padded_cache(
            [(cache, row, offset, len(ids) - 1) for cache, row, offset, ids, _ in rows]
        )
        if prefix is None:
            return None
        width = max(len(ids) for _, _, _, ids, _ in rows)
        # Left padding, as for any batched ``generate``: every input ends at the same column, the
        # mask hides the padding and ``generate`` derives each row's positions from the mask.
        input_ids = torch.full((len(rows), width), self.loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, _, _, ids, _) in enumerate(rows):
            input_ids[r, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
            mask[r, width - len(ids) :] = 1
        device = self.loaded.device
        budget = self.max_new_tokens - min(drafted for _, _, _, _, drafted in rows)
        with torch.inference_mode():
            out = self.loaded.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=budget,
                **self._greedy_kwargs(),
                **{self._cache_kw: prefix},
            )
            steps = torch.stack([step.float() for step in out.logits], dim=1)  # rows x steps x V
            if full_logits:
                per_row: Any = steps.cpu()
            else:
                top = steps.topk(2, dim=-1).values
                # (margin, top logit) per step
                per_row = torch.stack([top[..., 0] - top[..., 1], top[..., 0]], dim=-1).cpu()
        sequences = out.sequences[:, width:].cpu()
        return [([int(t) for t in sequences[r]], list(per_row[r])) for r in range(len(rows))]


@dataclass
class _Pending:
    """A turn the forward pass did not settle: generate it, continuing from ``draft``."""

    row: int
    turn_no: int
    turn: _Turn
    draft: tuple[int, ...]
    #: the forward pass's cache, whose row ``row`` holds this turn's prompt and draft (but
    #: the draft's last token) from column ``offset`` on; after a verification pass, that
    #: pass's cache
    cache: Any
    #: which of the batches held for generation this turn belongs to
    batch: int = 0
    #: the row and first column of ``cache`` holding this turn (``cache_row`` -1: ``row``)
    offset: int = 0
    cache_row: int = -1
    #: True once a verification pass made ``draft`` longer
    grown: bool = False
    #: how many of the prompt's and draft's tokens ``cache`` holds from ``offset`` on (-1: all
    #: but the draft's last); fewer after a packed verification pass grew the draft (its
    #: cache is the forward pass's, which holds only the prompt and the first draft)
    held: int = -1

    def __post_init__(self) -> None:
        if self.cache_row < 0:
            self.cache_row = self.row
        if self.held < 0:
            self.held = self.length - 1

    @property
    def length(self) -> int:
        return len(self.turn.prompt.ids) + len(self.draft)

    @property
    def unheld(self) -> list[int]:
        """The prompt's and draft's tokens after those ``cache`` holds."""
        return [*self.turn.prompt.ids, *self.draft][self.held :]


def _packed_source(
    rows: list[tuple[Any, int, int]],
) -> tuple[list[tuple[Any, Any]], list[int]] | None:
    """The cache a packed verification pass reads for ``(cache, row, cut)`` rows (each
    turn's first ``cut`` positions in row ``row`` of ``cache`` from column 0 on), and per row
    its row there: the one cache as it is (no copy), or, when the rows come from several
    forward passes' caches, their rows that hold turns copied once into one (right padding:
    masked). ``None`` unless all are plain full-attention caches holding the cut columns."""
    layouts: dict[int, list[tuple[Any, Any]]] = {}
    for cache, row, cut in rows:
        if cache is None:
            return None
        if id(cache) not in layouts:
            layers = full_attention_kv(cache)
            if not layers or any(k is None or k.dim() != 4 for k, _ in layers):
                return None
            first = layers[0][0]
            if any(
                k.shape[0] != first.shape[0] or k.shape[-2] != first.shape[-2] for k, _ in layers
            ):
                return None
            layouts[id(cache)] = layers
        keys = layouts[id(cache)][0][0]
        if not 0 <= row < keys.shape[0] or cut > keys.shape[-2]:
            return None
    if len({len(layers) for layers in layouts.values()}) != 1:
        return None
    if len(layouts) == 1:
        return next(iter(layouts.values())), [row for _, row, _ in rows]
    slots: dict[tuple[int, int], int] = {}
    for cache, row, _ in rows:
        slots.setdefault((id(cache), row), len(slots))
    width = max(layers[0][0].shape[-2] for layers in layouts.values())
    data = []
    for i in range(len(next(iter(layouts.values())))):
        keys, values = next(iter(layouts.values()))[i]
        k = keys.new_zeros((len(slots), keys.shape[1], width, keys.shape[3]))
        v = values.new_zeros((len(slots), values.shape[1], width, values.shape[3]))
        for (cache_id, row), slot in slots.items():
            row_keys, row_values = layouts[cache_id][i]
            k[slot, :, : row_keys.shape[-2]] = row_keys[row]
            v[slot, :, : row_values.shape[-2]] = row_values[row]
        data.append((k, v))
    return data, [slots[(id(cache), row)] for cache, row, _ in rows]


def _left_padded_cache(rows: list[tuple[Any, int, int, int]]) -> Any:
    """A fresh ``DynamicCache`` with, for each ``(cache, row, start, length)``, the ``length``
    cached positions of ``row`` of ``cache`` from column ``start`` on, right-aligned (left
    padding with zeros, masked later). The rows may come from the caches of different
    forward passes (right-padded conversations: ``start`` 0; a verification pass's
    left-padded cache: ``start`` is where the row's tokens begin).

    Only plain full-attention layers can be cut this way (a sliding-window layer keeps only
    its window; other cache kinds hold no per-position tensors): ``None`` otherwise, and the
    turns are generated from scratch by the reference call.
    """
    if any(cache is None or length < 1 or start < 0 for cache, _, start, length in rows):
        return None
    # transformers' cache layout (one (keys, values) pair per layer): see compat.transformers
    layouts: dict[int, list[tuple[Any, Any]]] = {}
    for cache, _, _, _ in rows:
        if id(cache) not in layouts:
            layers = full_attention_kv(cache)
            if layers is None:
                return None
            layouts[id(cache)] = layers
    if len({len(layers) for layers in layouts.values()}) != 1:
        return None
    width = max(length for _, _, _, length in rows)
    data = []
    for i in range(len(next(iter(layouts.values())))):
        for cache, _, start, length in rows:
            keys = layouts[id(cache)][i][0]
            if keys is None or keys.dim() != 4 or keys.shape[-2] < start + length:
                return None
        keys, values = next(iter(layouts.values()))[i]
        # New tensors: the batch cache stays intact for the other turns (the copy-before-reuse
        # the transformers docs ask for).
        k = keys.new_zeros((len(rows), keys.shape[1], width, keys.shape[3]))
        v = values.new_zeros((len(rows), values.shape[1], width, values.shape[3]))
        for r, (cache, row, start, length) in enumerate(rows):
            row_keys, row_values = layouts[id(cache)][i]
            k[r, :, width - length :] = row_keys[row, :, start : start + length]
            v[r, :, width - length :] = row_values[row, :, start : start + length]
        data.append((k, v))
    return dynamic_cache(data)


def _unique(scenarios: Iterable[Scenario]) -> list[Scenario]:
    seen: set[str] = set()
    out = []
    for s in scenarios:
        if s.id not in seen:
            seen.add(s.id)
            out.append(s)
    return out
