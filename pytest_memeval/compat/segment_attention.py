"""Segment attention for the packed verification pass: many short continuations in one row,
each attending over a prefix of a cached conversation row and over its own tokens.

The fast path's verification pass (``decode/fast/verify.py``) feeds the pending turns of
many conversations in one model call. Fed as a batch of padded rows over the forward pass's
cache, each row's attention first copies that row's whole cache (``DynamicLayer.update``
concatenates) and, under grouped-query attention, repeats its keys and values per query head
(``repeat_kv``): on SmolLM2-135M (30 layers, 3 KV heads of 9) that memory traffic, not the
fed tokens, was most of the pass. Here the fed tokens of all turns are one row, no padding,
no cache; a function registered with transformers' public ``AttentionInterface.register``
(4.48+), switched on with ``set_attn_implementation`` (4.56+) for the call, computes each
group's attention (the turns of one cached row) against that row's cached keys and values as
they are (views, no copy) and its own fed keys, grouped-query heads by reshaping the queries,
with the softmax in fp32 as the eager functions compute it. It is a different computation of
the same attention: the calibration's ``verify`` kind measures it against the reference call.

Where a layer's attention is more than ``softmax(q k^T * scaling + mask) v`` (a soft cap, a
sliding window, attention sinks: keyword arguments the modeling code passes), the group runs
through the model's own attention function instead, with the row's keys concatenated and a
4D mask: exact semantics, copies included. Private or undocumented parts used, checked on
transformers 5.24.0: as in :mod:`.row_attention` (``layer_idx`` on attention modules, the
modeling module's ``eager_attention_forward``, ``config._attn_implementation``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_memeval.compat.attention import attention_implementation
from pytest_memeval.compat.row_attention import own_attention, row_attention_unavailable
from pytest_memeval.compat.transformers import Model, base_model

if TYPE_CHECKING:
    import torch

__all__ = [
    "SEGMENT_ATTENTION",
    "SegmentGroup",
    "segment_attention",
    "segment_attention_unavailable",
]

#: The name the segment attention function is registered under.
SEGMENT_ATTENTION = "memeval_segments"

#: Keyword arguments of an attention call that change what it computes beyond the plain
#: formula (``None`` or absent: plain): then the model's own function computes the group.
_NOT_PLAIN = ("softcap", "sliding_window", "s_aux", "sinks", "position_bias")


@dataclass(frozen=True)
class SegmentGroup:
    """Fed tokens ``start .. stop - 1`` of the call's one row: turns of cached row ``row``,
    attending over its first ``width`` cached columns and their own fed tokens as
    ``allowed`` says (``(stop - start) x (width + stop - start)``, bool)."""

    row: int
    start: int
    stop: int
    width: int
    allowed: torch.Tensor


@dataclass
class _Call:
    """What the registered function reads during one call."""

    #: per layer, the cached ``(keys, values)``: ``rows x kv_heads x columns x head_dim``
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    groups: Sequence[SegmentGroup]
    #: the model's own attention implementation (for the groups that are not plain)
    implementation: str
    #: where each layer's fed keys and values are put, by layer index (``None``: not kept)
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None


_CALL: ContextVar[_Call | None] = ContextVar("memeval_segment_attention", default=None)


def _plain(kwargs: dict[str, Any]) -> bool:
    return all(kwargs.get(name) is None for name in _NOT_PLAIN)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed`` as an additive mask in ``dtype``: 0 where allowed, the dtype's minimum
    elsewhere (as the modeling code's masks are)."""
    import torch

    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def _group_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cached: tuple[torch.Tensor, torch.Tensor],
    allowed: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """``softmax(q [k_cached; k] ^T * scaling + mask) [v_cached; v]`` for one group:
    ``query`` ``heads x n x d``, ``key``/``value`` ``kv_heads x n x d``, ``cached``
    ``kv_heads x width x d`` (views); ``heads x n x d`` out."""
    import torch

    heads, n, dim = query.shape
    kv_heads, width = cached[0].shape[0], cached[0].shape[1]
    groups = heads // kv_heads
    # query head h reads kv head h // groups: its rows side by side, no key repeated
    q = query.reshape(kv_heads, groups * n, dim)
    scores = (
        torch.cat([q @ cached[0].transpose(-1, -2), q @ key.transpose(-1, -2)], dim=-1) * scaling
    )
    scores = scores.view(kv_heads, groups, n, width + n) + _additive(allowed, scores.dtype)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = weights.view(kv_heads, groups * n, width + n)
    out = weights[..., :width] @ cached[1] + weights[..., width:] @ value
    return out.view(heads, n, dim)


def _own_group_attention(
    module: Any,
    implementation: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cached: tuple[torch.Tensor, torch.Tensor],
    allowed: torch.Tensor,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """One group through the model's own attention function: keys and values concatenated,
    an additive 4D mask; ``heads x n x d`` out."""
    import torch

    keys = torch.cat([cached[0], key], dim=-2)[None]
    values = torch.cat([cached[1], value], dim=-2)[None]
    mask = _additive(allowed, query.dtype)[None, None]
    attend = own_attention(module, implementation)
    out, _ = attend(module, query[None], keys, values, mask, **kwargs)
    # attention functions return batch x tokens x heads x d
    result: torch.Tensor = out[0].transpose(0, 1)
    return result


def _segments_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Each group's attention over its cached row's prefix and its own fed tokens (the
    call's mask is not read: the groups carry theirs)."""
    call = _CALL.get()
    if call is None:
        raise RuntimeError(
            f"the {SEGMENT_ATTENTION!r} attention runs only inside segment_attention()"
        )
    if query.shape[0] != 1:
        raise RuntimeError("segment attention computes a call of one row")
    cached_keys, cached_values = call.layers[module.layer_idx]
    if call.captured is not None:
        # the fed tokens' keys and values as a cache would hold them (after the rotary
        # embedding, one per KV head): what the caller keeps for its next call
        call.captured[module.layer_idx] = (key, value)
    # The plain formula where the layer passes its scaling and nothing else that changes it
    # (GPT-2's eager function, for one, scales inside: the model's own function does that).
    plain = scaling is not None and _plain(kwargs) and not kwargs.get("dropout")
    out = query.new_empty((query.shape[2], query.shape[1], query.shape[3]))  # tokens x heads x d
    for group in call.groups:
        span = slice(group.start, group.stop)
        cached = (
            cached_keys[group.row, :, : group.width],
            cached_values[group.row, :, : group.width],
        )
        q, k, v = query[0, :, span], key[0, :, span], value[0, :, span]
        if plain and scaling is not None:
            got = _group_attention(q, k, v, cached, group.allowed, float(scaling))
        else:
            if scaling is not None:
                kwargs = {**kwargs, "scaling": scaling}
            got = _own_group_attention(
                module, call.implementation, q, k, v, cached, group.allowed, kwargs
            )
        out[span] = got.transpose(0, 1)
    return out[None], None


def segment_attention_unavailable(model: Model) -> str | None:
    """Why segment attention cannot run on ``model`` here (``None``: it can; the function is
    then registered)."""
    why = row_attention_unavailable(model)
    if why is not None:
        return why
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_ATTENTION, _segments_attention)
    return None


@contextmanager
def segment_attention(
    model: Model,
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
    groups: Sequence[SegmentGroup],
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Iterator[None]:
    """Run the block (one call over one row of fed tokens, ``groups`` covering them) with
    each group attending over its cached row in ``layers`` and its own tokens; the model's
    own attention implementation is set back after, also when the block raises. Call
    :func:`segment_attention_unavailable` first (it registers the function). ``captured``:
    filled with each layer's fed keys and values (``1 x kv_heads x tokens x head_dim``, by
    layer index), for a caller that keeps them as a cache (the call itself keeps none)."""
    base = base_model(model)
    implementation = attention_implementation(model)
    assert implementation is not None and implementation != SEGMENT_ATTENTION
    token = _CALL.set(_Call(layers, groups, implementation, captured))
    base.set_attn_implementation(SEGMENT_ATTENTION)
    try:
        yield
    finally:
        base.set_attn_implementation(implementation)
        _CALL.reset(token)
