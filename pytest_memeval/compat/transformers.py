"""transformers internals: the compiled chat template and the dynamic KV cache's layout.

transformers is imported inside each function (heavy: seconds), so that importing this module,
or a plain ``pytest`` that loads no model, stays cheap. Checked on transformers 5.24.0
(installed, the newest release) and 4.54.0; both helpers fall back where the internal is
missing (4.45-4.53 have no ``DynamicLayer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["compile_chat_template", "dynamic_cache", "full_attention_kv"]


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


def full_attention_kv(cache: Any) -> list[tuple[Any, Any]] | None:
    """``(keys, values)`` per layer of a ``DynamicCache`` whose every layer is a plain
    full-attention ``DynamicLayer`` (tensors ``batch x heads x positions x head_dim``), or
    ``None`` for any other cache (sliding-window, quantised, static, linear-attention layers
    keep no cut-able per-position tensors) or a transformers without that layout."""
    # public classes, undocumented layout: transformers.cache_utils.DynamicLayer,
    # Cache.layers, DynamicLayer.keys/.values (4.54.0-5.24.0; no DynamicLayer before 4.54).
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def dynamic_cache(data: Sequence[tuple[Any, Any]]) -> Any:
    """A new ``DynamicCache`` holding ``(keys, values)`` per layer (full attention), sharing
    the given tensors rather than copying them: a forward pass over it concatenates into new
    tensors (``DynamicLayer.update``), never writing into these, so a cache it was cut from or
    wraps stays intact."""
    # public: DynamicCache(ddp_cache_data) takes an iterable of (keys, values) per layer
    # (4.54.0-5.24.0); only called with what full_attention_kv returned, so the layout exists.
    # It fills each layer with ``torch.cat([empty, keys])``, a full copy: built from zero-width
    # views, then given the tensors themselves (DynamicLayer.keys/.values, as
    # full_attention_kv reads them), the one copy left is the pass's own concatenation.
    from transformers.cache_utils import DynamicCache

    pairs = list(data)
    cache = DynamicCache([(k[..., :0, :], v[..., :0, :]) for k, v in pairs])
    layer: Any  # DynamicLayer, as built above from plain (keys, values) pairs
    for layer, (k, v) in zip(cache.layers, pairs, strict=True):
        layer.keys, layer.values = k, v
    return cache
