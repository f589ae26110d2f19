"""transformers' attention implementation of a loaded model: read it, and switch it for a call.

A model's attention implementation (``eager``, ``sdpa``, ``flash_attention_2``...) is chosen at
load time (``attn_implementation=``) and kept in its config; transformers 4.56+ can switch it
on a loaded model (``PreTrainedModel.set_attn_implementation``, public) for the models whose
attention goes through ``AttentionInterface`` (``_can_set_attn_implementation``, private).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pytest_memeval.compat.transformers import base_model

__all__ = ["attention_implementation", "can_switch_attention", "switched_attention"]


def attention_implementation(model: Any) -> str | None:
    """The attention implementation ``model`` runs now, or ``None`` when it cannot be read."""
    # private attribute, read-only here: PretrainedConfig._attn_implementation (4.45-5.24)
    value = getattr(getattr(base_model(model), "config", None), "_attn_implementation", None)
    return value if isinstance(value, str) else None


def can_switch_attention(model: Any, implementation: str | None = None) -> bool:
    """Whether ``model``'s attention implementation can be switched after loading (to
    ``implementation``, when given: an architecture without it, e.g. Gemma-2 without sdpa,
    refuses the switch with a ``ValueError``; tried once here, then set back)."""
    base = base_model(model)
    # public: set_attn_implementation (4.56+); private: _can_set_attn_implementation (4.56-5.24)
    check = getattr(base, "_can_set_attn_implementation", None)
    if not (hasattr(base, "set_attn_implementation") and callable(check) and bool(check())):
        return False
    before = attention_implementation(model)
    if implementation is None or before is None or implementation == before:
        return before is not None or implementation is None
    try:
        base.set_attn_implementation(implementation)
    except (ValueError, ImportError):  # not supported by this architecture / not installed
        return False
    base.set_attn_implementation(before)
    return True


@contextmanager
def switched_attention(model: Any, implementation: str | None) -> Iterator[None]:
    """Run the block with ``model``'s attention set to ``implementation`` (``None``: as it
    is), then set it back, also when the block raises."""
    base = base_model(model)
    before = attention_implementation(model)
    if implementation is None or implementation == before or before is None:
        yield
        return
    base.set_attn_implementation(implementation)
    try:
        yield
    finally:
        base.set_attn_implementation(before)
