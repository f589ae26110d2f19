"""The linear probe: which of a model's matmul kernels give each row, in a batch of rows, the
bits it gets alone.

The exact stage (``exact.py``) runs one single-token step for many turns at once; its logits
are the reference call's batch-1 logits only if every linear layer computes a row the same
whatever the rows beside it. Kernels are chosen by shape and dtype, so the probe tries every
distinct weight of the model (peft's LoRA A and B included) on random rows, alone and in
groups, and says up to how many rows each passes (:func:`probe_linear_rows`, the
:class:`~.bounds.ExactMode` it gives). A probe is a test, not a proof: the calibration also
checks the whole computation end to end (``calibration.py``). See ``docs/decoding.md``,
"Exact steps".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_memeval.compat.transformers import Model
from pytest_memeval.decode.fast.bounds import ExactMode

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXACT_ROWS",
    "PROBE_BUDGET",
    "PROBE_POOL",
    "ROW_BY_ROW_SHARE",
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
