"""Per-row attention for batched single-token steps: each row attends alone, over its own cache.

The fast path's exact stage (``decode/fast/exact.py``) runs one single-token step for many
turns in one model call: the linear layers see all rows at once, while attention must see
each row exactly as a batch-1 ``generate`` step sees it (its own keys and values, grown by
``torch.cat`` as ``DynamicLayer.update`` grows them, no padding, no mask). That is done with
transformers' public attention registry: a function registered with
``AttentionInterface.register`` (4.48+) and switched on with
``PreTrainedModel.set_attn_implementation`` (4.56+) for the duration of a step, which calls
the model's own attention function once per row.

Private or undocumented parts used here, checked on transformers 5.24.0: attention modules
carry ``layer_idx`` (public attribute, every decoder architecture of 4.48-5.24); the eager
attention function is the modeling module's own ``eager_attention_forward`` (a module-level
name, looked up on the module of the attention layer's class; 4.48-5.24); the implementation
in use is ``config._attn_implementation`` (read through :mod:`.attention`). Where any of it is
missing :func:`row_attention_unavailable` says why, and the exact stage stays off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_memeval.compat.attention import attention_implementation
from pytest_memeval.compat.transformers import Model, base_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "ROW_ATTENTION",
    "RowCaches",
    "own_attention",
    "row_attention",
    "row_attention_unavailable",
]

#: The name the per-row attention function is registered under.
ROW_ATTENTION = "memeval_rows"

#: Per row, per layer: ``(keys, values)``, ``1 x kv_heads x positions x head_dim``. A step
#: replaces each entry with the grown tensors (new tensors: the old ones are never written).
RowCaches = list[list[tuple["torch.Tensor", "torch.Tensor"]]]


@dataclass
class _Step:
    """What the registered function reads during one step."""

    rows: RowCaches
    #: the model's own attention implementation (the one each row is computed with)
    implementation: str


_STEP: ContextVar[_Step | None] = ContextVar("memeval_row_attention", default=None)
_EAGER: dict[type, Callable[..., Any]] = {}


def own_attention(module: Any, implementation: str) -> Callable[..., Any]:
    """The attention function ``module`` calls under ``implementation`` (as the modeling
    code picks it: the registry's, or its module's own eager function)."""
    from transformers import AttentionInterface

    if implementation != "eager":
        function: Callable[..., Any] = AttentionInterface()[implementation]  # type: ignore[no-untyped-call]
        return function
    found = _EAGER.get(type(module))
    if found is None:
        found = sys.modules[type(module).__module__].eager_attention_forward
        _EAGER[type(module)] = found
    return found


def _rows_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Each row's attention alone over its cache plus its new key and value, mask ``None``
    (a batch-1 step of an unpadded prompt has nothing to mask)."""
    import torch

    step = _STEP.get()
    if step is None:
        raise RuntimeError(f"the {ROW_ATTENTION!r} attention runs only inside row_attention()")
    inner = own_attention(module, step.implementation)
    layer = module.layer_idx
    outputs = []
    for r, caches in enumerate(step.rows):
        keys, values = caches[layer]
        keys = torch.cat([keys, key[r : r + 1]], dim=-2)
        values = torch.cat([values, value[r : r + 1]], dim=-2)
        caches[layer] = (keys, values)
        out, _ = inner(module, query[r : r + 1], keys, values, None, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=0), None


def row_attention_unavailable(model: Model) -> str | None:
    """Why per-row attention cannot run on ``model`` here (``None``: it can)."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return "this transformers has no AttentionInterface (4.48+)"
    base = base_model(model)
    check = getattr(base, "_can_set_attn_implementation", None)
    if not (hasattr(base, "set_attn_implementation") and callable(check) and bool(check())):
        return "the attention implementation of this model cannot be switched (transformers 4.56+)"
    implementation = attention_implementation(model)
    if implementation is None:
        return "the attention implementation of this model cannot be read"
    attention = [m for m in base.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling")]
    if not attention:
        return "no attention layers with a layer index found"
    if implementation != "eager" and implementation not in AttentionInterface():  # type: ignore[no-untyped-call]
        return f"attention {implementation!r} is not in transformers' AttentionInterface"
    if implementation == "eager" and not all(
        callable(getattr(sys.modules[type(m).__module__], "eager_attention_forward", None))
        for m in attention
    ):
        return "the eager attention function of this architecture cannot be found"
    AttentionInterface.register(ROW_ATTENTION, _rows_attention)
    return None


@contextmanager
def row_attention(model: Model, rows: RowCaches) -> Iterator[None]:
    """Run the block (one batched single-token step over ``len(rows)`` rows, ``use_cache``
    off) with each row attending alone over ``rows[r]``, which the step grows; the model's
    own attention implementation is set back after, also when the block raises. Call
    :func:`row_attention_unavailable` first (it registers the function)."""
    base = base_model(model)
    implementation = attention_implementation(model)
    assert implementation is not None and implementation != ROW_ATTENTION
    token = _STEP.set(_Step(rows, implementation))
    base.set_attn_implementation(ROW_ATTENTION)
    try:
        yield
    finally:
        base.set_attn_implementation(implementation)
        _STEP.reset(token)
