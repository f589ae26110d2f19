"""The closed loop's extension passes: each episode's kept cache grown by its new tokens.

A step's prompt is the last step's prompt (whose keys and values the fast policy kept, but
its last token's) and the tokens that followed: the action's end, the next observation, the
generation prompt. :class:`Extender` computes their keys and values for every episode asked
at once, in one forward pass that keeps only the caches:

* **in one row** where the model allows segment attention (``compat/segment_attention.py``,
  as the verification pass's packed pass): each episode's new tokens a group attending over
  its kept keys and values as they are (no padding, no cache grown by concatenation at
  every layer, no key repeated per query head); the fed tokens' own keys and values are
  captured from the attention calls and appended to a copy of the kept ones;
* else **over the left-padded, cut caches** (the verification pass's cut computation,
  ``kvcache.cut_inputs``), the episodes of a pass planned by the tokens they feed under the
  teacher-forced passes' rules (``rules.py``).

Both are other computations of the reference's prefill, equal up to rounding; the fast
policy's ``generate`` bound, calibrated on its own steps, guards every decision made from
them (``episodes.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_memeval.compat.attention import switched_attention
from pytest_memeval.compat.segment_attention import (
    segment_attention,
    segment_attention_unavailable,
)
from pytest_memeval.compat.transformers import forward_parameters, full_attention_kv, lm_forward
from pytest_memeval.decode.fast.kvcache import cut_inputs, flatten, packed_source
from pytest_memeval.decode.fast.rules import BatchingRules
from pytest_memeval.decode.fast.stats import ClosedLoopStats
from pytest_memeval.decode.fast.verify import Continuation
from pytest_memeval.model.loading import LoadedModel

if TYPE_CHECKING:
    import torch

__all__ = ["Extender", "Layers"]

#: Keys and values (batch 1) per layer: one episode's kept cache
Layers = list[tuple["torch.Tensor", "torch.Tensor"]]


class Extender:
    """Grows kept caches by their new tokens (see the module docstring), counting its
    passes, tokens and seconds in the fast policy's ``stats``."""

    def __init__(
        self,
        loaded: LoadedModel,
        attention: str | None,
        rules: BatchingRules,
        max_batch_tokens: int,
        stats: ClosedLoopStats,
    ) -> None:
        self.loaded = loaded
        #: the attention implementation of the cut pass (``None``: the model's)
        self.attention = attention
        self.rules = rules
        self.max_batch_tokens = max_batch_tokens
        self.stats = stats

    def extend(self, growths: Sequence[Continuation]) -> list[Layers] | None:
        """Each context grown by its tokens, in one forward pass over all of them, keeping
        only the caches: in one row with segment attention where the model allows it
        (:meth:`_flat`), else over the left-padded, cut caches (the verification
        pass's cut computation: ``kvcache.cut_inputs``); ``None`` where the caches cannot
        be cut."""
        started = time.perf_counter()
        flat = self._flat(growths)
        grown = flat if flat is not None else self._cut(growths)
        self.stats.extended_tokens += sum(len(g.tokens) for g in growths)
        self.stats.extend_passes += 1
        self.stats.flat_extend_passes += int(flat is not None)
        self.stats.seconds["extend"] += time.perf_counter() - started
        return grown

    def _cut(self, growths: Sequence[Continuation]) -> list[Layers] | None:
        """The extension over the left-padded, cut caches; ``None`` where they cannot be
        cut."""
        import torch

        contexts = [g.context for g in growths]
        cut = cut_inputs(contexts, [g.tokens for g in growths], self.loaded.pad_id)
        if cut is None:
            return None
        device = self.loaded.device
        inputs: dict[str, object] = {
            "input_ids": cut.input_ids.to(device),
            "attention_mask": cut.attention_mask.to(device),
        }
        params = forward_parameters(self.loaded.model)
        if params.position_ids:
            inputs["position_ids"] = cut.position_ids.to(device)
        if params.logits_to_keep:
            inputs["logits_to_keep"] = 1  # only the cache is wanted
        with torch.inference_mode(), switched_attention(self.loaded.model, self.attention):
            out = lm_forward(self.loaded.model, inputs, cache=cut.cache)
        layers = full_attention_kv(out.cache)
        if layers is None:
            return None
        rows = []
        for r, g in enumerate(growths):
            # its cache, then its new tokens
            own = slice(cut.width - g.context.length, cut.width + len(g.tokens))
            rows.append([(k[r : r + 1, :, own], v[r : r + 1, :, own]) for k, v in layers])
        return rows

    def passes(self, fed: Sequence[int]) -> list[list[int]]:
        """Indices of ``fed`` (tokens each prompt feeds) by extension pass: in one row
        (segment attention: nothing padded) as many as ``max_batch_tokens`` allows; over
        padded rows, planned by the teacher-forced passes' rules (``rules.py``: on the CPU
        at least 90% real tokens a pass, 16-bit one row a pass)."""
        if self.segments_unavailable is not None:
            return self.rules.plan(fed, max_batch_tokens=self.max_batch_tokens)
        passes: list[list[int]] = []
        tokens = 0
        for n, count in enumerate(fed):
            if not passes or tokens + count > self.max_batch_tokens:
                passes.append([])
                tokens = 0
            passes[-1].append(n)
            tokens += count
        return passes

    @functools.cached_property
    def segments_unavailable(self) -> str | None:
        """Why the extension cannot run in one row with segment attention (``None``: it
        can), asked once per model."""
        return segment_attention_unavailable(self.loaded.model)

    def _flat(self, growths: Sequence[Continuation]) -> list[Layers] | None:
        """The extension in one row, no padding (``kvcache.flatten``): each context's
        new tokens a group of segment attention over its kept keys and values as they are
        (``compat/segment_attention.py``: no cache grown by concatenation at every layer,
        no key repeated per query head), their own keys and values captured from the
        attention calls and appended to a copy of the context's. ``None`` when the model
        or the caches do not allow it (the cut pass computes it then)."""
        import torch

        if self.segments_unavailable is not None or any(not g.tokens for g in growths):
            return None
        contexts = [g.context for g in growths]
        source = packed_source(contexts)
        if source is None:
            return None
        flat = flatten(contexts, [g.tokens for g in growths], source)
        device = self.loaded.device
        inputs: dict[str, object] = {
            "input_ids": flat.input_ids.to(device),
            "position_ids": flat.positions.to(device),
            "use_cache": False,
        }
        if forward_parameters(self.loaded.model).logits_to_keep:
            inputs["logits_to_keep"] = 1  # only the keys and values are wanted
        captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with (
            torch.inference_mode(),
            segment_attention(self.loaded.model, source.layers, flat.groups, captured),
        ):
            self.loaded.model(**inputs)
        if sorted(captured) != list(range(len(source.layers))):
            return None  # not every layer's attention ran through the function
        rows = []
        for n, g in enumerate(growths):
            at, fed, length = source.rows[n], flat.segments[n], g.context.length
            own = slice(fed.start, fed.start + fed.length)
            rows.append(
                [
                    (
                        torch.cat([keys[at : at + 1, :, :length], captured[i][0][:, :, own]], 2),
                        torch.cat([values[at : at + 1, :, :length], captured[i][1][:, :, own]], 2),
                    )
                    for i, (keys, values) in enumerate(source.layers)
                ]
            )
        return rows
