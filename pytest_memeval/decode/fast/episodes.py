"""The closed loop's fast policy: each episode's cache kept across steps, its steps batched.

The reference policy (:class:`~pytest_memeval.decode.policy.ModelPolicy`) renders the whole
conversation at every step and calls ``generate`` on it: an episode of N steps reads
O(N^2) tokens. A step's prompt, though, begins with the tokens the episode's last step read
(the conversation only grows: the action, then the next observation), so their keys and
values are already computed. :class:`FastPolicy` keeps them:

1. **The prompt** is built exactly as the reference builds it
   (:meth:`ModelPolicy.prompt_ids`: the chat template's rendering, tokenised as the reference
   tokenises it), and checked against the context limit the same way. The cache is reused
   only for the longest common prefix of those ids with the ids a kept cache holds, never
   for tokens the model generated and the template re-encodes differently.
2. **Extension**: one forward pass over the new tokens but the last of several prompts at
   once grows each kept cache to its whole prompt but one token: in one row without padding,
   each prompt's tokens attending over its kept keys and values as they are (segment
   attention, as the verification pass's packed pass), their keys and values captured and
   appended; where the model does not allow that, over the left-padded, cut caches. The
   prompts of a pass are planned by the tokens they feed (``rules.py``).
3. **Decoding**: the steps of every episode asked at once (:meth:`FastPolicy.decide`) take
   one batched greedy ``generate`` from those caches (``generate.py``'s call: left padding,
   each row feeding its prompt's last token), keeping each step's logits.
4. **The guard**: every decision that shaped an output (up to and including its stop id) must
   clear the ``generate`` bound (``bounds.py``), set from what this policy measured on its own
   first steps (the calibration: those steps are also decoded by the reference call, whose
   output is the one returned, and the disagreement of each step's logits is measured while
   both agree). An output with a decision inside the bound is decoded again by the reference
   call itself, as is a step whose cache cannot be kept (not plain full-attention layers) and
   an episode's first step (no cache yet: the reference call's own prefill is kept instead).

So every action is the reference's unless a decision the bound trusts is one the reference
computation makes differently, the argument of ``docs/decoding.md`` ("Why one forward pass
is enough"), and the tests compare whole trajectories in the real simulator, on the demo
model and on SmolLM2 (``tests/integration/test_fast_closed_loop.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.attention import switched_attention
from pytest_memeval.compat.transformers import (
    dynamic_cache,
)
from pytest_memeval.decode.batches import even_batches
from pytest_memeval.decode.fast.bounds import Bounds, Calibration, Disagreement, Kind
from pytest_memeval.decode.fast.calibration import Measurements, measurement_setting
from pytest_memeval.decode.fast.extension import Extender, Layers
from pytest_memeval.decode.fast.forward import forward_attention_for
from pytest_memeval.decode.fast.generate import GenerateRow, Generator, used_tokens
from pytest_memeval.decode.fast.kvcache import CacheSlice
from pytest_memeval.decode.fast.rules import DEFAULT_MAX_BATCH_TOKENS, batching_rules
from pytest_memeval.decode.fast.shared import Shared
from pytest_memeval.decode.fast.stats import ClosedLoopStats
from pytest_memeval.decode.fast.stored import CalibrationOutcome, CalibrationStore, Measurement
from pytest_memeval.decode.fast.verify import Continuation
from pytest_memeval.decode.policy import ModelPolicy
from pytest_memeval.decode.reference import ReferenceSteps, decode_new_tokens, reference_steps
from pytest_memeval.env import ContextLimitExceeded, Message, PolicyOutput
from pytest_memeval.model.loading import LoadedModel

if TYPE_CHECKING:
    pass

__all__ = ["CALIBRATION_STEPS", "EPISODES_TOGETHER", "KEPT_CACHES", "FastPolicy"]

#: Cached steps a policy also decodes with the reference call to measure its disagreement
#: before it trusts its own decisions (the returned output of those steps is the reference's).
CALIBRATION_STEPS = 8
#: Most episodes one process steps together (:meth:`FastPolicy.decide`'s batch): a ``generate``
#: step costs about the same for 1 row or 16 on a CPU (it reads every weight once), so more
#: episodes at once spread that cost; each holds an environment (a JVM for TextWorld Express).
EPISODES_TOGETHER = 8
#: Caches a policy keeps (the most recently used): one per episode under way is enough; the
#: lockstep runner holds at most :data:`EPISODES_TOGETHER` episodes at once.
KEPT_CACHES = 2 * EPISODES_TOGETHER


@dataclass
class _Kept:
    """Token ids and the keys and values (batch 1, per layer) of exactly those tokens."""

    ids: tuple[int, ...]
    layers: Layers
    used: int = 0


@dataclass(frozen=True)
class _Prefix:
    """A kept cache and how many first tokens of a prompt it holds."""

    kept: _Kept
    length: int


class _KeptCaches:
    """The caches a policy keeps across steps, the most recently used first to stay."""

    def __init__(self) -> None:
        self._kept: list[_Kept] = []
        self._clock = 0

    def longest_prefix(self, ids: tuple[int, ...]) -> _Prefix | None:
        """The kept cache sharing the most first tokens with ``ids`` (short of its last
        token, whose logits decide the first output token); ``None`` when none shares one
        (an episode's first step, unless another episode's system prompt is kept)."""
        best: _Prefix | None = None
        for kept in self._kept:
            limit = min(len(kept.ids), len(ids) - 1)
            same = 0
            while same < limit and kept.ids[same] == ids[same]:
                same += 1
            if same > 0 and (best is None or same > best.length):
                best = _Prefix(kept, same)
        return best

    def touch(self, kept: _Kept) -> None:
        """``kept`` was used now."""
        self._clock += 1
        kept.used = self._clock

    def keep(self, ids: tuple[int, ...], layers: Layers) -> None:
        """Keep ``layers`` as the cache of ``ids`` (dropping the least recently used past
        :data:`KEPT_CACHES`, and any kept cache of a prefix of ``ids``: this one holds it)."""
        self._clock += 1
        self._kept = [k for k in self._kept if k.ids != ids[: len(k.ids)]]
        self._kept.append(_Kept(ids, layers, self._clock))
        if len(self._kept) > KEPT_CACHES:
            self._kept.sort(key=lambda k: k.used)
            del self._kept[0]


class FastPolicy(ModelPolicy):
    """The reference policy's actions, computed from kept caches and in batches (see the
    module docstring). A :data:`~pytest_memeval.env.Policy` (one conversation at a time) and,
    through :meth:`decide`, the batch policy of the lockstep runner.

    ``margin``: a fixed bound for every decision (no calibration; ``memeval bench
    --margin``); ``calibration_steps``: how many cached steps are measured against the
    reference call first (0: the fixed bounds of ``bounds.MARGINS`` by dtype); ``store``:
    where calibrations are kept (``stored.py``): one stored for this model and setting is
    used instead of measuring, and one measured is stored.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        max_new_tokens: int,
        *,
        context_limit: int | None = None,
        margin: float | None = None,
        calibration_steps: int = CALIBRATION_STEPS,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        store: CalibrationStore | None = None,
    ) -> None:
        super().__init__(loaded, max_new_tokens, context_limit=context_limit)
        device_type = loaded.device.split(":")[0]
        self.bounds = Bounds(loaded.dtype, device_type, margin=margin)
        self.generator = Generator(
            Shared.new(loaded, max_new_tokens, self.bounds), max_batch_tokens=max_batch_tokens
        )
        self.max_batch_tokens = max_batch_tokens
        #: the attention implementation of the cached computations (``None``: the model's);
        #: the reference calls keep the model's own
        self.attention = forward_attention_for(loaded, "auto")
        self.stats = ClosedLoopStats()
        self.extender = Extender(
            loaded,
            self.attention,
            batching_rules(device_type, loaded.dtype),
            max_batch_tokens,
            self.stats,
        )
        self._calibration_left = 0 if margin is not None else calibration_steps
        self._measured = Measurements(loaded.dtype)
        self._kept = _KeptCaches()
        self.store = store
        #: how the calibration in use came about: measured by this policy (and stored, if
        #: it could be) or reused from the store; ``None`` without a store or until then
        self.calibration_outcome: CalibrationOutcome | None = None
        if store is not None and self._calibration_left > 0:
            setting = self._setting(self._calibration_left)
            stored = store.lookup(setting)
            if stored is not None:
                self.bounds.use(stored.calibration)
                entry = store.entry(setting)
                self.calibration_outcome = CalibrationOutcome("reused", 0.0, entry, stored)
                self._calibration_left = 0

    # -- the policy ------------------------------------------------------------------------

    def __call__(self, messages: Sequence[Message]) -> PolicyOutput:
        decided = self.decide([messages])[0]
        if isinstance(decided, ContextLimitExceeded):
            raise decided
        return decided

    def decide(
        self, conversations: Sequence[Sequence[Message]]
    ) -> list[PolicyOutput | ContextLimitExceeded]:
        """The next action of each conversation, as :class:`ModelPolicy` decides it; a
        conversation whose prompt no longer fits gets the :class:`ContextLimitExceeded` its
        call alone would raise."""
        started = time.perf_counter()
        prompts = [tuple(self.prompt_ids(m)) for m in conversations]
        self.stats.seconds["prompts"] += time.perf_counter() - started
        decided: list[PolicyOutput | ContextLimitExceeded | None] = [None] * len(prompts)
        prefixes: dict[int, _Prefix] = {}
        for n, ids in enumerate(prompts):
            over = self.over_context(ids)
            if over is not None:
                decided[n] = over
                continue
            self.stats.steps += 1
            prefix = self._kept.longest_prefix(ids)
            if prefix is None:
                self.stats.first_steps += 1
                decided[n] = self._reference(ids)
            else:
                prefixes[n] = prefix
        contexts = self._grow(prompts, prefixes)
        for n in prefixes:
            if n not in contexts:
                self.stats.uncached += 1
                decided[n] = self._reference(prompts[n])
        order = list(contexts)
        lengths = [len(prompts[n]) for n in order]
        for batch in even_batches(lengths, self.generator.rows_per_call, self.max_batch_tokens):
            rows = [order[k] for k in batch]
            for n, out in zip(rows, self._generate(rows, prompts, contexts), strict=True):
                decided[n] = out
        assert all(d is not None for d in decided)  # every conversation was decided above
        return [d for d in decided if d is not None]

    # -- growing the kept caches -----------------------------------------------------------

    def _grow(
        self, prompts: Sequence[tuple[int, ...]], prefixes: dict[int, _Prefix]
    ) -> dict[int, CacheSlice]:
        """For each prompt ``n`` of ``prefixes``, the keys and values of all its tokens but
        the last: its prefix's, grown by batched extension passes over the rest (and kept
        for the next step). A prompt missing from the result has no cache this model can
        keep (it goes to the reference call)."""
        layers_of: dict[int, Layers] = {}
        growths: dict[int, Continuation] = {}
        for n, prefix in prefixes.items():
            self._kept.touch(prefix.kept)
            self.stats.reused_tokens += prefix.length
            cut = [
                (k[:, :, : prefix.length], v[:, :, : prefix.length]) for k, v in prefix.kept.layers
            ]
            ids = prompts[n]
            if prefix.length == len(ids) - 1:
                layers_of[n] = cut
            else:
                context = CacheSlice(dynamic_cache(cut), 0, 0, prefix.length)
                growths[n] = Continuation(context, ids[prefix.length : -1])
        order = list(growths)
        for batch in self.extender.passes([len(growths[n].tokens) for n in order]):
            rows = [order[k] for k in batch]
            grown = self.extender.extend([growths[n] for n in rows])
            if grown is not None:
                layers_of.update(zip(rows, grown, strict=True))
        contexts = {}
        for n in prefixes:
            if n in layers_of:
                self._kept.keep(prompts[n][:-1], layers_of[n])
                contexts[n] = CacheSlice(dynamic_cache(layers_of[n]), 0, 0, len(prompts[n]) - 1)
        return contexts

    # -- decoding --------------------------------------------------------------------------

    def _generate(
        self,
        rows: Sequence[int],
        prompts: Sequence[tuple[int, ...]],
        contexts: dict[int, CacheSlice],
    ) -> list[PolicyOutput]:
        """One batched ``generate`` from the rows' caches; each output trusted, measured
        (calibrating) or decoded again by the reference call."""
        started = time.perf_counter()
        with switched_attention(self.loaded.model, self.attention):
            call = self.generator.run([GenerateRow(contexts[n], prompts[n], 0) for n in rows])
        self.stats.seconds["generate"] += time.perf_counter() - started
        if call is None:  # the cache cannot be cut: no kept cache for this model
            self.stats.uncached += len(rows)
            return [self._reference(prompts[n]) for n in rows]
        self.stats.generate_calls += 1
        outputs = []
        for r, (n, new, checks) in enumerate(zip(rows, call.tokens, call.checks(), strict=True)):
            used = used_tokens(new[: self.max_new_tokens], self.generator.stop)
            if self._calibration_left > 0:
                self._calibration_left -= 1
                self.stats.calibration_steps += 1
                started = time.perf_counter()
                reference = self._reference_steps(prompts[n])
                self.stats.calibration_seconds += time.perf_counter() - started
                self._measured.add_agreeing("generate", call.logits_of(r), new, reference)
                outputs.append(self._output(reference.tokens))
                if self._calibration_left == 0:
                    self._calibrated()
            elif all(
                self.bounds.trusted("generate", checks.margin[k], checks.top[k])
                for k in range(len(used))
            ):
                self.stats.cached += 1
                outputs.append(self._output(used))
            else:
                self.stats.near_tie += 1
                outputs.append(self._output(self._reference_steps(prompts[n]).tokens))
        return outputs

    def _setting(self, steps: int) -> dict[str, str | int | None]:
        """What this policy's calibration of ``steps`` cached steps depends on besides the
        weights (``calibration.measurement_setting``), marked as the closed loop's (stored
        apart from the teacher-forced decoder's), with how its extension passes run."""
        setting = measurement_setting(
            self.loaded,
            self.attention,
            batch_size=self.generator.rows_per_call,
            max_batch_tokens=self.max_batch_tokens,
            max_new_tokens=self.max_new_tokens,
            turns=steps,
        )
        extension = "segments" if self.extender.segments_unavailable is None else "cut"
        return {**setting, "measured_by": "closed_loop_policy", "extension": extension}

    def _calibrated(self) -> None:
        """The bounds from this policy's measurements (``generate``: cached, batched
        generation vs the reference call on the same prompts), stored when there is a
        store."""
        steps = self.stats.calibration_steps
        setting = self._setting(steps)
        measured: dict[Kind, Disagreement] = {"generate": self._measured.disagreement()["generate"]}
        calibration = Calibration(setting, steps, measured)
        self.bounds.use(calibration)
        if self.store is not None:
            self.calibration_outcome = self.store.save(
                setting, Measurement(calibration), self.stats.calibration_seconds
            )

    def _reference(self, ids: tuple[int, ...]) -> PolicyOutput:
        """The reference call's output on ``ids`` (its prompt's cache kept)."""
        return self._output(self._reference_steps(ids).tokens)

    def _reference_steps(self, ids: tuple[int, ...]) -> ReferenceSteps:
        """The reference call, keeping its prompt's cache (its own bits) for the next step."""
        started = time.perf_counter()
        call = reference_steps(self.loaded, ids, self.max_new_tokens, keep_prompt_cache=True)
        if call.prompt_cache is not None:
            self._kept.keep(ids, list(call.prompt_cache))
        self.stats.seconds["reference"] += time.perf_counter() - started
        return call

    def _output(self, tokens: Sequence[int]) -> PolicyOutput:
        out = decode_new_tokens(self.loaded, tokens)
        return PolicyOutput(out.text, truncated=not out.stopped)
