"""Exact steps: pending turns decoded greedily bit for bit as the reference call decodes them.

A turn's prefill is the reference's own call, ``generate(prompt, max_new_tokens=1)``: it
gives the first token, its logits and the prompt's key/value cache. Then many turns take
their single-token steps together, one model call per step: the linear layers run on all
rows at once, and attention runs per row over that row's own cache, grown by ``torch.cat``
exactly as ``DynamicLayer.update`` grows it, with the model's own attention function
(``compat/row_attention.py``). Rows leave at a stop id or at the token budget, and waiting
turns take their places (prefilled as they join). Each row then computes the same
functions, on the same shapes, from the same input bits as the reference call's batch-1
step, so its logits are the reference's bit for bit *provided* the linear kernels give a
row the same bits whatever the number of rows beside it: :func:`probe_linear_rows` checks
that for every linear weight shape of the model, and the calibration checks the whole
computation end to end on its turns (``calibration.py``); together they make the
:class:`~.bounds.ExactMode`. No margin bound is needed for what this stage decides: an exact
tie breaks as the reference's ``argmax`` breaks it. See ``docs/decoding.md``, "Exact steps".
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_memeval.compat.row_attention import (
    RowCaches,
    row_attention,
    row_attention_unavailable,
)
from pytest_memeval.compat.transformers import (
    Model,
    forward_parameters,
    full_attention_kv,
    generate_with_logits,
)
from pytest_memeval.decode._types import TurnOutput
from pytest_memeval.decode.fast.bounds import ExactMode
from pytest_memeval.decode.fast.forward import PendingTurn
from pytest_memeval.decode.fast.shared import Shared, Stage
from pytest_memeval.decode.reference import decode_new_tokens, greedy_settings, reference_steps

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXACT_ROWS",
    "ROW_BY_ROW_SHARE",
    "ExactStage",
    "ExactTurn",
    "matmul_modules",
    "probe_linear_rows",
    "weight_name",
]

#: The most rows one exact step runs (the probe looks no further). On this CPU in bf16
#: (oneDNN) every linear shape of SmolLM2-135M gives rows bit-identical to one row alone up
#: to 28 rows; a step of 16 rows cost about twice a batch-1 step (the per-row attention
#: calls, not the linear layers, grow with the rows), so more rows gain little, and the
#: probe's cost grows with the square of this number (its lm_head groups).
EXACT_ROWS = 16
#: The largest share of the model's linear parameters that may run row by row in an exact
#: step (weights whose kernel is batch-variant already at two rows): peft keeps LoRA's A and
#: B in fp32 under a 16-bit model, and fp32 kernels here are batch-variant, but they are a
#: small part of the work (r=8 on SmolLM2-135M: 0.7% of its linear parameters).
ROW_BY_ROW_SHARE = 0.1
#: Random rows the probe computes per weight (alone, then in groups of each size), and the
#: multiply-adds it spends per group size and weight: a large weight gets fewer rows (the
#: lm_head of SmolLM2-135M, 49152x576: :data:`EXACT_ROWS` alone, one group of each size).
PROBE_POOL = 256
PROBE_BUDGET = 1 << 27


def matmul_modules(model: Model) -> list[torch.nn.Module]:
    """The modules of ``model`` that multiply rows by a weight matrix: ``nn.Linear`` (peft's
    LoRA A and B included) and transformers' ``Conv1D`` (GPT-2's projections)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    return [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D))]


def _features(module: torch.nn.Module) -> tuple[int, int]:
    """``(in, out)`` of a matmul module (``Conv1D`` stores its weight ``in x out``)."""
    w = module.weight
    assert isinstance(w, _tensor())
    return (w.shape[1], w.shape[0]) if hasattr(module, "in_features") else (w.shape[0], w.shape[1])


def _size(module: torch.nn.Module) -> int:
    w = module.weight
    assert isinstance(w, _tensor())
    return int(w.numel())


def weight_name(module: torch.nn.Module) -> str:
    """A matmul module's kernel class: ``"out x in dtype"`` (``" +bias"`` with a bias)."""
    w = module.weight
    assert isinstance(w, _tensor())
    inputs, outputs = _features(module)
    name = f"{outputs}x{inputs} {str(w.dtype).removeprefix('torch.')}"
    return name + (" +bias" if getattr(module, "bias", None) is not None else "")


def _rows_alone_equal(module: torch.nn.Module, limit: int, seed: int) -> int:
    """The largest ``R <= limit`` such that the module over ``M <= R`` rows gave every row
    the bits it got alone, over a pool of :func:`_pool_rows` random rows (1: two rows
    already differed)."""
    import torch

    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    pool = _pool_rows(weight.numel(), limit)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(pool, _features(module)[0], generator=generator)
    # Spread over 2**-8..2**8: sums of products that need rounding, so that two kernels
    # summing in different orders show it. The difference can be rare (1 output in 10,000
    # for a 64x64 bf16 weight here, none at plain normal inputs in 2,000): hence the pool.
    x *= torch.exp2(torch.randint(-8, 9, x.shape, generator=generator).float())
    x = x.to(dtype=weight.dtype, device=weight.device)
    alone: list[torch.Tensor] = []  # row i alone, computed as the groups reach it
    tried = min(pool, PROBE_BUDGET // max(1, weight.numel()))
    for m in range(2, limit + 1):
        for start in range(0, max(m, tried) - m + 1, m):
            alone += [module(x[i : i + 1]) for i in range(len(alone), start + m)]
            together = module(x[start : start + m])
            if not torch.equal(together, torch.cat(alone[start : start + m])):
                return m - 1
    return limit


def _pool_rows(weight_size: int, limit: int) -> int:
    """Rows the probe tries per weight, alone and in groups of each size: up to
    :data:`PROBE_POOL`, fewer for large weights (:data:`PROBE_BUDGET` multiply-adds per
    group size), at least ``limit`` alone and one group of each size."""
    return max(limit, min(PROBE_POOL, PROBE_BUDGET // max(1, weight_size)))


def probe_linear_rows(
    model: Model, limit: int = EXACT_ROWS, share: float = ROW_BY_ROW_SHARE
) -> ExactMode:
    """Which linear kernels batch exactly: for every distinct linear weight of ``model``
    (shape, dtype, bias; peft's LoRA A and B included), the largest row count ``M`` for
    which ``F.linear`` gives each row the bits it gives that row alone, with real weights
    and random inputs in the weight's dtype (kernels are chosen by shape and dtype, not by
    values). The weights that differ already at two rows run row by row in the exact
    steps (LoRA's fp32 A and B under a 16-bit model); the others set the rows per step.
    Off when fewer than two rows, or when the weights that would run row by row hold more
    than ``share`` of the linear parameters (:data:`ROW_BY_ROW_SHARE`)."""
    import torch

    modules = matmul_modules(model)
    sizes = {id(m): _size(m) for m in modules}
    total = max(1, sum(sizes.values()))
    kinds: dict[str, list[torch.nn.Module]] = {}
    for module in sorted(modules, key=lambda m: -sizes[id(m)]):
        kinds.setdefault(weight_name(module), []).append(module)
    shapes = tuple(kinds)
    row_by_row, alone = [], 0.0
    with torch.inference_mode():
        # Two rows first, largest weight first: a batch-variant large weight (fp32 here), or
        # too many small ones (the demo), end the probe before the longer sweep.
        for n, (name, same) in enumerate(kinds.items()):
            if _rows_alone_equal(same[0], 2, seed=n) >= 2:
                continue
            row_by_row.append(name)
            alone += sum(sizes[id(m)] for m in same) / total
            if alone > share:
                why = (
                    f"linear weight {row_by_row[0]} on {same[0].weight.device}: two rows at "
                    "once do not give the bits of each row alone (a batch-variant kernel); "
                    f"such weights hold {alone:.0%} of the linear parameters or more, at "
                    f"most {share:.0%} may run row by row"
                )
                return ExactMode(1, why, shapes, row_by_row=tuple(row_by_row))
        rows = limit
        for n, (name, same) in enumerate(kinds.items()):
            if name not in row_by_row:
                rows = min(rows, _rows_alone_equal(same[0], rows, seed=n))
    return ExactMode(rows, None, shapes, row_by_row=tuple(row_by_row))


def _tensor() -> type[torch.Tensor]:
    import torch

    return torch.Tensor


def _one_row_at_a_time(forward: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    """``forward(x)`` computed row by row (dimension 0), each row as a batch-1 step has it."""
    import torch

    return torch.cat([forward(x[r : r + 1]) for r in range(x.shape[0])], dim=0)


@contextmanager
def _row_by_row(modules: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Run the block with ``modules`` computing one row at a time (an instance attribute
    ``forward``, which ``nn.Module.__call__`` calls, wraps the one in use), then as before
    (an instance ``forward`` set by someone else, e.g. accelerate's hooks, is put back)."""
    saved = [module.__dict__.get("forward") for module in modules]
    for module in modules:
        module.forward = functools.partial(_one_row_at_a_time, module.forward)
    try:
        yield
    finally:
        for module, before in zip(modules, saved, strict=True):
            if before is None:
                del module.forward
            else:
                module.forward = before


@dataclass(frozen=True)
class ExactTurn:
    """A turn decoded by the exact stage: its new tokens (up to and including a stop id, or
    the token budget's worth) and, when asked for, each step's fp32 logits."""

    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...] = ()


@dataclass
class _Row:
    """A turn in the batch: where its output goes, its next position, its cache per layer,
    its tokens so far (and logits, when kept)."""

    index: int
    position: int
    caches: list[tuple[torch.Tensor, torch.Tensor]]
    tokens: list[int]
    logits: list[torch.Tensor] = field(default_factory=list)


class ExactStage(Stage):
    """Decodes turns from their prompts in batched exact steps (see the module docstring)."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        #: whether this model can run per-row attention (``None``: it can), asked once
        self._unavailable: str | bool | None = False

    def unavailable(self) -> str | None:
        """Why the exact stage cannot run on this model (``None``: it can)."""
        if self._unavailable is False:
            self._unavailable = row_attention_unavailable(self.loaded.model)
            if self._unavailable is None and not forward_parameters(self.loaded.model).position_ids:
                self._unavailable = "the model's forward takes no position_ids"
        assert self._unavailable is not True
        return self._unavailable

    def settle(self, pending: Sequence[PendingTurn], mode: ExactMode) -> list[TurnOutput]:
        """Each pending turn's output, decoded from its prompt (its draft is not needed:
        every token is decided here as the reference decides it)."""
        if not pending:
            return []
        started = time.perf_counter()
        turns = self.decode([p.turn.prompt.ids for p in pending], mode)
        self.stats.exact_turns += len(pending)
        self.seconds.exact += time.perf_counter() - started
        return [decode_new_tokens(self.loaded, t.tokens) for t in turns]

    def decode(
        self, prompts: Sequence[Sequence[int]], mode: ExactMode, *, keep_logits: bool = False
    ) -> list[ExactTurn]:
        """Greedy decoding of each prompt, up to ``mode.rows`` turns per step (the linear
        layers of ``mode.row_by_row`` row by row); with ``keep_logits``, each step's logits
        too (for the calibration's check)."""
        why = self.unavailable()  # also registers the per-row attention function
        if why is not None:
            raise RuntimeError(f"the exact stage cannot run on this model: {why}")
        rows = max(1, mode.rows)
        alone = [m for m in matmul_modules(self.loaded.model) if weight_name(m) in mode.row_by_row]
        waiting = deque(range(len(prompts)))
        active: list[_Row] = []
        done: dict[int, ExactTurn] = {}
        while waiting or active:
            while waiting and len(active) < rows:
                index = waiting.popleft()
                row = self._prefill(index, prompts[index], keep_logits)
                if row is None:
                    done[index] = ExactTurn(self._reference(prompts[index]))
                elif self._finished(row):
                    done[index] = ExactTurn(tuple(row.tokens), tuple(row.logits))
                else:
                    active.append(row)
            if active:
                with _row_by_row(alone):
                    self._step(active, keep_logits)
                for row in [r for r in active if self._finished(r)]:
                    active.remove(row)
                    done[row.index] = ExactTurn(tuple(row.tokens), tuple(row.logits))
        return [done[i] for i in range(len(prompts))]

    def _finished(self, row: _Row) -> bool:
        return row.tokens[-1] in self.stop or len(row.tokens) >= self.max_new_tokens

    def _prefill(self, index: int, prompt: Sequence[int], keep_logits: bool) -> _Row | None:
        """The reference's own call for the first token: its token, logits and cache
        (``None`` when the cache is not plain full-attention layers)."""
        import torch

        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.loaded.device)
        settings = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "max_new_tokens": 1,
            **greedy_settings(self.loaded),
        }
        with torch.inference_mode():
            out = generate_with_logits(self.loaded.model, settings)
        self.stats.exact_prefills += 1
        caches = full_attention_kv(out.cache)
        if caches is None:
            return None
        token = int(out.sequences[0, len(prompt)])
        logits = [out.logits[0][0].float().cpu()] if keep_logits else []
        return _Row(index, len(prompt), list(caches), [token], logits)

    def _step(self, active: list[_Row], keep_logits: bool) -> None:
        """One batched single-token step: each row's last token at its own position."""
        import torch

        device = self.loaded.device
        inputs: dict[str, object] = {
            "input_ids": torch.tensor([[r.tokens[-1]] for r in active], device=device),
            "position_ids": torch.tensor([[r.position] for r in active], device=device),
            "use_cache": False,
        }
        if forward_parameters(self.loaded.model).logits_to_keep:
            inputs["logits_to_keep"] = 1  # as generate passes it
        caches: RowCaches = [r.caches for r in active]
        with torch.inference_mode(), row_attention(self.loaded.model, caches):
            # As generate reads its next token: the last position's logits in fp32, argmax.
            logits = self.loaded.model(**inputs).logits[:, -1, :].float()
        best = logits.argmax(dim=-1).tolist()
        self.stats.exact_steps += 1
        self.stats.exact_tokens += len(active)
        for r, row in enumerate(active):
            row.tokens.append(int(best[r]))
            row.position += 1
            if keep_logits:
                row.logits.append(logits[r].cpu())

    def _reference(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """A turn whose cache cannot be read: the reference call decides it."""
        self.stats.exact_reference += 1
        return tuple(reference_steps(self.loaded, prompt, self.max_new_tokens).tokens)
