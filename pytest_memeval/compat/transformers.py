"""transformers internals: the compiled chat template, the key/value cache's layout, and the
names a model's ``forward`` and its output objects use for the cache.

transformers is imported inside each function (heavy: seconds), so that importing this module,
or a plain ``pytest`` that loads no model, stays cheap. Checked on transformers 5.24.0
(installed, the newest release) and 4.54.0; the helpers fall back where the internal is
missing (4.45-4.53 have no ``DynamicLayer``).

The decode path calls the model only through :func:`lm_forward` and
:func:`generate_with_logits`, which hand back typed results (:class:`LMOutput`,
:class:`GeneratedSteps`): what differs between versions (``cache`` or ``past_key_values``, as
argument and as output attribute; ``logits_to_keep``) is resolved here.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch
    from transformers.cache_utils import Cache

__all__ = [
    "ForwardParameters",
    "GeneratedSteps",
    "KVCache",
    "LMOutput",
    "Model",
    "base_model",
    "compile_chat_template",
    "dynamic_cache",
    "forward_parameters",
    "full_attention_kv",
    "generate_with_logits",
    "growing_cache",
    "lm_forward",
    "output_rows",
    "vocab_size",
]

#: A model's key/value cache: a ``transformers.cache_utils.Cache`` (the forward passes' and
#: the verification passes' are ``DynamicCache``\ s); typed by transformers' own annotations.
KVCache: TypeAlias = "Cache"

#: The model a decoder runs: a transformers ``PreTrainedModel`` or a peft ``PeftModel``
#: wrapping one (``LoadedModel.model``). ``Any``: the two share no typed interface (peft
#: forwards attributes to the wrapped model at run time), and nn.Module calls return ``Any``.
Model: TypeAlias = Any


def compile_chat_template(template: str) -> Any | None:
    """The compiled Jinja template ``apply_chat_template`` renders ``template`` with (cached
    by transformers), or ``None`` when this transformers does not expose it (the caller then
    uses ``apply_chat_template`` itself)."""
    # private: transformers.utils.chat_template_utils._compile_jinja_template (an lru_cache'd
    # function of the template string; 4.45.0, 4.54.0, 5.24.0).
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    return _compile_jinja_template(template)


def full_attention_kv(cache: object) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """``(keys, values)`` per layer of a ``DynamicCache`` whose every layer is a plain
    full-attention ``DynamicLayer`` holding tensors ``batch x heads x positions x head_dim``,
    or ``None`` for any other cache (sliding-window, quantised, static, linear-attention
    layers keep no cut-able per-position tensors), a layer not filled yet, or a transformers
    without that layout."""
    # public classes, undocumented layout: transformers.cache_utils.DynamicLayer,
    # Cache.layers, DynamicLayer.keys/.values (4.54.0-5.24.0; no DynamicLayer before 4.54).
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    pairs = []
    for layer in layers:
        keys, values = layer.keys, layer.values
        if keys is None or values is None or keys.dim() != 4:
            return None
        pairs.append((keys, values))
    return pairs


def dynamic_cache(data: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> KVCache:
    """A new ``DynamicCache`` holding ``(keys, values)`` per layer (full attention), sharing
    the given tensors rather than copying them: a forward pass over it concatenates into new
    tensors (``DynamicLayer.update``), never writing into these, so a cache it was cut from or
    wraps stays intact."""
    # public: DynamicCache(ddp_cache_data) takes an iterable of (keys, values) per layer
    # (4.54.0-5.24.0); only called with what full_attention_kv returned, so the layout exists.
    # It fills each layer with ``torch.cat([empty, keys])``, a full copy: built from zero-width
    # views, then given the tensors themselves (DynamicLayer.keys/.values, as
    # full_attention_kv reads them), the one copy left is the pass's own concatenation.
    from transformers.cache_utils import DynamicCache, DynamicLayer

    pairs = list(data)
    cache = DynamicCache([(k[..., :0, :], v[..., :0, :]) for k, v in pairs])
    for layer, (k, v) in zip(cache.layers, pairs, strict=True):
        assert isinstance(layer, DynamicLayer)  # built above from plain (keys, values) pairs
        layer.keys, layer.values = k, v
    return cache


def growing_cache(buffers: Sequence[tuple[torch.Tensor, torch.Tensor]], filled: int) -> KVCache:
    """A ``DynamicCache`` over preallocated ``(keys, values)`` buffers per layer
    (``batch x heads x capacity x head_dim``) whose first ``filled`` positions hold the cached
    keys and values: a forward pass writes its new positions into the buffers in place, where
    ``DynamicLayer.update`` would concatenate (a copy of the whole cache for each generated
    token). Each layer's keys and values are views of the filled positions, the same values
    at the same positions as the concatenated tensors, so attention reads what it would read
    from them. Past the capacity a layer concatenates, as ``DynamicLayer`` does."""
    # public classes, undocumented layout: transformers.cache_utils.DynamicLayer (its
    # .keys/.values and the update / get_seq_length contract, 4.54.0-5.25.0); only called
    # where full_attention_kv found plain full-attention layers.
    from transformers.cache_utils import DynamicCache, DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]  # untyped in transformers
        """A ``DynamicLayer`` writing new positions into its buffers while they have room."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.room: tuple[torch.Tensor, torch.Tensor] | None = (keys, values)
            self.filled = filled
            self.device = keys.device
            self.keys, self.values = keys[..., :filled, :], values[..., :filled, :]
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            end = self.filled + key_states.shape[-2]
            if self.room is None or end > self.room[0].shape[-2]:
                self.room = None  # out of room: concatenate from now on
                return super().update(key_states, value_states, *args, **kwargs)
            keys, values = self.room
            keys[..., self.filled : end, :] = key_states
            values[..., self.filled : end, :] = value_states
            self.filled = end
            self.keys, self.values = keys[..., :end, :], values[..., :end, :]
            return self.keys, self.values

    pairs = list(buffers)
    cache = DynamicCache([(k[..., :0, :], v[..., :0, :]) for k, v in pairs])
    cache.layers = [GrowingLayer(k, v) for k, v in pairs]
    return cache


def base_model(model: Model) -> Model:
    """The transformers model under a peft wrapper (peft forwards to it), or ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@dataclass(frozen=True)
class ForwardParameters:
    """What a model's ``forward`` accepts, by name: architectures and releases differ."""

    #: the cache argument: ``cache`` (transformers 5) or ``past_key_values``
    cache: str
    #: ``logits_to_keep``: only the logits at these positions are computed
    logits_to_keep: bool
    #: ``position_ids``: positions given explicitly (``generate`` derives them from the mask)
    position_ids: bool


_PARAMETERS: dict[type, ForwardParameters] = {}


def forward_parameters(model: Model) -> ForwardParameters:
    """The :class:`ForwardParameters` of ``model`` (read once per model class)."""
    base = base_model(model)
    found = _PARAMETERS.get(type(base))
    if found is None:
        params = inspect.signature(base.forward).parameters
        # transformers 5 renamed ``past_key_values`` to ``cache``; support both spellings.
        found = ForwardParameters(
            cache="cache" if "cache" in params else "past_key_values",
            logits_to_keep="logits_to_keep" in params,
            position_ids="position_ids" in params,
        )
        _PARAMETERS[type(base)] = found
    return found


@dataclass(frozen=True)
class LMOutput:
    """A causal LM's forward pass: its logits (the model's dtype) and its key/value cache."""

    logits: torch.Tensor
    cache: KVCache | None


def lm_forward(
    model: Model, inputs: Mapping[str, object], cache: KVCache | None = None
) -> LMOutput:
    """``model(**inputs)`` continuing ``cache`` (under the name this model's ``forward``
    takes), with ``use_cache`` on: its logits and its cache."""
    kwargs = dict(inputs)
    if cache is not None:
        kwargs[forward_parameters(model).cache] = cache
    out = model(use_cache=True, **kwargs)
    # The output's cache attribute followed the argument's rename (transformers 5: ``cache``).
    kept = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return LMOutput(out.logits, kept)


@contextmanager
def output_rows(model: Model, index: torch.Tensor) -> Iterator[bool]:
    """Within the block, ``model``'s output embeddings compute only the positions ``index``
    picks per batch row (``batch x k``, into the positions they are given, e.g. those of
    ``logits_to_keep``): the logits come out ``batch x k x vocabulary``. A forward pre-hook
    (public ``nn.Module`` API) gathers their input; yields ``False``, hooking nothing, where
    the model has no output embedding module."""
    import torch

    head = base_model(model).get_output_embeddings()
    if not isinstance(head, torch.nn.Module):
        yield False
        return

    def gather(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        picked = torch.gather(hidden, 1, index[..., None].expand(-1, -1, hidden.shape[-1]))
        return (picked, *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield True
    finally:
        handle.remove()


@dataclass(frozen=True)
class GeneratedSteps:
    """A ``generate`` call's tokens (prompt columns included), per step its next-token
    logits (rows x vocabulary; ``output_logits``: before any logits processor), and the
    key/value cache it ended with (``None`` where the output carries none)."""

    sequences: torch.Tensor
    logits: tuple[torch.Tensor, ...]
    cache: KVCache | None = None


def generate_with_logits(
    model: Model, settings: Mapping[str, object], cache: KVCache | None = None
) -> GeneratedSteps:
    """``model.generate(**settings)`` continuing ``cache``, returning each step's logits."""
    kwargs = dict(settings)
    if cache is not None:
        kwargs[forward_parameters(model).cache] = cache
    out = model.generate(output_logits=True, return_dict_in_generate=True, **kwargs)
    # The output's cache attribute followed the argument's rename (transformers 5: ``cache``;
    # 5.24 still answers ``past_key_values``, with a deprecation warning).
    kept = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return GeneratedSteps(out.sequences, tuple(out.logits), kept)


def vocab_size(model: Model) -> int:
    """Logits per position: the output embedding's rows, or the config's ``vocab_size``
    where the model has no output embedding to read (0 when neither is known)."""
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
        return int(weight.shape[0])
    return int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
