"""Cache slicing and packing: the key/value positions a turn's continuation reads.

A turn pending after the forward pass continues from its prompt (and draft) as the forward
pass's cache holds them: a :class:`CacheSlice`. ``generate`` and the cut verification pass
read slices copied into a fresh left-padded cache (:func:`left_padded_cache`); the packed
verification pass reads the forward passes' caches as they are, several turns of one
conversation fed back to back in one row, each seeing only its own slice through a 4D mask
(:func:`pack`), or, where the model's attention can be switched, all in one row with no
padding and no copy, each conversation's turns a group of segment attention over its cache
row (:func:`flatten`, ``compat/segment_attention.py``). Only plain full-attention caches
can be read this way (``compat.transformers.full_attention_kv``); for any other the
functions return ``None`` and the caller falls back (see ``verify.py`` and ``generate.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_memeval.compat.segment_attention import SegmentGroup
from pytest_memeval.compat.transformers import (
    KVCache,
    dynamic_cache,
    full_attention_kv,
    growing_cache,
)
from pytest_memeval.decode.fast.logits import Segment

if TYPE_CHECKING:
    import torch

__all__ = [
    "CacheSlice",
    "CutInputs",
    "FlatRows",
    "PackedRows",
    "PackedSource",
    "cut_inputs",
    "flatten",
    "left_padded_cache",
    "pack",
    "packed_source",
]

Layers = list[tuple["torch.Tensor", "torch.Tensor"]]


@dataclass(frozen=True)
class CacheSlice:
    """Positions ``start .. start + length - 1`` of row ``row`` of ``cache``: the cached
    keys and values of one turn's first ``length`` tokens (its prompt, then its draft)."""

    cache: KVCache
    row: int
    start: int
    length: int


def _layouts(slices: Sequence[CacheSlice]) -> dict[int, Layers] | None:
    """Each distinct cache's ``(keys, values)`` per layer, by ``id``; ``None`` unless all are
    plain full-attention caches with the same number of layers."""
    layouts: dict[int, Layers] = {}
    for piece in slices:
        if id(piece.cache) not in layouts:
            layers = full_attention_kv(piece.cache)
            if layers is None:
                return None
            layouts[id(piece.cache)] = layers
    if len({len(layers) for layers in layouts.values()}) != 1:
        return None
    return layouts


def left_padded_cache(slices: Sequence[CacheSlice], room: int = 0) -> KVCache | None:
    """A fresh ``DynamicCache`` whose row ``r`` holds slice ``r`` right-aligned (left
    padding with zeros, masked by the caller). The slices may come from the caches of
    different passes (right-padded conversations: ``start`` 0; a cut verification pass's
    left-padded cache: ``start`` is where the row's tokens begin). With ``room``, the cache
    has room for that many more positions, written in place by the passes that continue it
    (``compat.transformers.growing_cache``: ``generate`` would otherwise copy the whole cache
    at every token). ``None`` where a cache cannot be cut (see the module docstring): the
    turns then go to the reference call."""
    if any(piece.length < 1 or piece.start < 0 for piece in slices):
        return None
    layouts = _layouts(slices)
    if layouts is None:
        return None
    width = max(piece.length for piece in slices)
    data = []
    for i in range(len(next(iter(layouts.values())))):
        if any(layouts[id(p.cache)][i][0].shape[-2] < p.start + p.length for p in slices):
            return None
        keys, values = next(iter(layouts.values()))[i]
        # New tensors: the batch cache stays intact for the other turns (the copy-before-reuse
        # the transformers docs ask for). Only the padding is zeroed (masked, but it must be
        # finite: a masked position's weight is 0, and 0 times NaN is NaN); the room is
        # written before it is read.
        k = keys.new_empty((len(slices), keys.shape[1], width + room, keys.shape[3]))
        v = values.new_empty((len(slices), values.shape[1], width + room, values.shape[3]))
        for r, piece in enumerate(slices):
            row_keys, row_values = layouts[id(piece.cache)][i]
            span = slice(piece.start, piece.start + piece.length)
            pad = width - piece.length
            k[r, :, :pad] = 0
            v[r, :, :pad] = 0
            k[r, :, pad:width] = row_keys[piece.row, :, span]
            v[r, :, pad:width] = row_values[piece.row, :, span]
        data.append((k, v))
    return growing_cache(data, width) if room > 0 else dynamic_cache(data)


@dataclass(frozen=True)
class CutInputs:
    """A cut pass's inputs: the contexts copied into one left-padded cache (:attr:`width`
    columns; row ``r``'s starts at ``width - contexts[r].length``), each row's tokens from
    column 0 on (right padding after them), the mask hiding both paddings, and each row's
    positions continuing from its own length, as ``generate`` numbers them."""

    cache: KVCache
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    width: int


def cut_inputs(
    contexts: Sequence[CacheSlice], tokens: Sequence[Sequence[int]], pad_id: int
) -> CutInputs | None:
    """The inputs of one cached forward pass continuing each context with its tokens
    (:class:`CutInputs`, on the CPU); ``None`` when the caches cannot be cut."""
    # Deferred: torch takes seconds to import; only a model run needs it.
    import torch

    prefix = left_padded_cache(contexts)
    if prefix is None:
        return None
    width = max(c.length for c in contexts)
    span = max(len(t) for t in tokens)
    input_ids = torch.full((len(contexts), span), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width + span), dtype=torch.long)
    positions = torch.zeros((len(contexts), span), dtype=torch.long)
    for r, (context, fed) in enumerate(zip(contexts, tokens, strict=True)):
        cut = context.length
        input_ids[r, : len(fed)] = torch.tensor(list(fed), dtype=torch.long)
        mask[r, width - cut : width + len(fed)] = 1
        # Padding after the fed tokens gets the next positions: masked, never attended to.
        positions[r] = torch.arange(cut, cut + span)
    return CutInputs(prefix, input_ids, mask, positions, width)


@dataclass(frozen=True)
class PackedSource:
    """The cache a packed pass reads: ``(keys, values)`` per layer, and per slice its row."""

    layers: Layers
    rows: list[int]


def packed_source(slices: Sequence[CacheSlice]) -> PackedSource | None:
    """The cache as it is (no copy) when every slice comes from one cache; when they come
    from several forward passes' caches, their rows that hold slices copied once into one
    (right padding: masked). ``None`` unless every slice starts at column 0 of a plain
    full-attention cache that holds it."""
    if any(piece.start != 0 or piece.length < 1 for piece in slices):
        return None
    layouts = _layouts(slices)
    if layouts is None:
        return None
    for layers in layouts.values():
        first = layers[0][0]
        if any(k.shape[0] != first.shape[0] or k.shape[-2] != first.shape[-2] for k, _ in layers):
            return None
    for piece in slices:
        keys = layouts[id(piece.cache)][0][0]
        if not 0 <= piece.row < keys.shape[0] or piece.length > keys.shape[-2]:
            return None
    if len(layouts) == 1:
        return PackedSource(next(iter(layouts.values())), [piece.row for piece in slices])
    slots: dict[tuple[int, int], int] = {}
    for piece in slices:
        slots.setdefault((id(piece.cache), piece.row), len(slots))
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
    return PackedSource(data, [slots[(id(piece.cache), piece.row)] for piece in slices])


@dataclass(frozen=True)
class PackedRows:
    """The inputs of a packed pass: every row of the source cache fed the tokens of all
    the turns it holds, back to back (``segments``: where each turn's tokens are)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    #: additive, ``rows x 1 x tokens x (cache width + tokens)``, in the cache's dtype
    mask: torch.Tensor
    segments: list[Segment]


def pack(
    slices: Sequence[CacheSlice], fed: Sequence[Sequence[int]], source: PackedSource, pad_id: int
) -> PackedRows:
    """Turn ``n``'s tokens ``fed[n]`` at positions ``slices[n].length + k`` of its source
    row, seeing the cache's first ``slices[n].length`` columns and its own earlier fed
    tokens only: the keys and values a cut cache would give it, with none of its copies."""
    # Deferred: torch takes seconds to import; only a model run needs it.
    import torch

    batch, width = source.layers[0][0].shape[0], source.layers[0][0].shape[-2]
    by_row: dict[int, list[int]] = {}
    for n, row in enumerate(source.rows):
        by_row.setdefault(row, []).append(n)
    span = max(sum(len(fed[n]) for n in ns) for ns in by_row.values())
    ids = [[pad_id] * span for _ in range(batch)]
    cuts = [[0] * span for _ in range(batch)]
    owner = [[-1] * span for _ in range(batch)]  # which turn each fed token is (-1: padding)
    positions = [[0] * span for _ in range(batch)]
    segments: dict[int, Segment] = {}
    for row, ns in by_row.items():
        pos = 0
        for n in ns:
            cut = slices[n].length
            segments[n] = Segment(row, pos, len(fed[n]))
            for k, token in enumerate(fed[n]):
                ids[row][pos + k], cuts[row][pos + k] = token, cut
                owner[row][pos + k], positions[row][pos + k] = n, cut + k
            pos += len(fed[n])
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
    dtype = source.layers[0][0].dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return PackedRows(
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        mask[:, None],
        [segments[n] for n in range(len(slices))],
    )


@dataclass(frozen=True)
class FlatRows:
    """The inputs of a packed pass in one row: every turn's tokens back to back, grouped by
    the source row they continue (``segments``: where each turn's tokens are; ``groups``:
    what each group attends to, for ``compat.segment_attention``)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    segments: list[Segment]
    groups: list[SegmentGroup]


def flatten(
    slices: Sequence[CacheSlice], fed: Sequence[Sequence[int]], source: PackedSource
) -> FlatRows:
    """What :func:`pack` feeds, in one row without padding: turn ``n``'s tokens ``fed[n]``
    at positions ``slices[n].length + k``, in the group of its source row, seeing that
    row's first ``slices[n].length`` cached columns and its own earlier fed tokens only."""
    # Deferred: torch takes seconds to import; only a model run needs it.
    import torch

    by_row: dict[int, list[int]] = {}
    for n, row in enumerate(source.rows):
        by_row.setdefault(row, []).append(n)
    ids: list[int] = []
    positions: list[int] = []
    segments: dict[int, Segment] = {}
    groups: list[SegmentGroup] = []
    for row, turns in by_row.items():
        start = len(ids)
        cuts: list[int] = []
        owner: list[int] = []
        for n in turns:
            cut = slices[n].length
            segments[n] = Segment(0, len(ids), len(fed[n]))
            ids += fed[n]
            positions += range(cut, cut + len(fed[n]))
            cuts += [cut] * len(fed[n])
            owner += [n] * len(fed[n])
        width = max(slices[n].length for n in turns)
        cut_t = torch.tensor(cuts, dtype=torch.long)
        owner_t = torch.tensor(owner, dtype=torch.long)
        step = torch.arange(len(owner))
        allowed = torch.cat(
            [
                torch.arange(width)[None, :] < cut_t[:, None],
                (owner_t[:, None] == owner_t[None, :]) & (step[None, :] <= step[:, None]),
            ],
            dim=-1,
        )
        device = source.layers[0][0].device
        groups.append(SegmentGroup(row, start, len(ids), width, allowed.to(device)))
    return FlatRows(
        torch.tensor([ids], dtype=torch.long),
        torch.tensor([positions], dtype=torch.long),
        [segments[n] for n in range(len(slices))],
        groups,
    )
