"""Batching rules by device kind (decode/fast/rules.py): on an accelerator the forward passes
are full; on the CPU the plan is what it was before the rules moved into one place.

The lengths are the demo's and SmolLM2's conversations of the 189 oracle scenarios, and the
CPU plans the ones the decoder made of them before (``data/batch_plans.json`` says how both
were derived)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.decode.batches import padded_tokens
from pytest_memeval.decode.fast import (
    ACCELERATOR,
    CPU,
    DEFAULT_ACCELERATOR_BATCH_SIZE,
    DEFAULT_BATCH_SIZES,
    DEFAULT_MAX_BATCH_TOKENS,
    FORWARD_MIN_FILL,
    batching_rules,
    device_kind,
)

DATA = json.loads((Path(__file__).parent / "data" / "batch_plans.json").read_text())
LENGTHS: dict[str, list[int]] = DATA["lengths"]
DTYPES = ("float32", "bfloat16", "float16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(LENGTHS))
@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps"])
def test_accelerator_passes_are_full(device: str, name: str, dtype: str) -> None:
    lengths = LENGTHS[name]
    rules = batching_rules(device, dtype)
    assert rules.device_kind == ACCELERATOR and rules.min_fill == 0 and not rules.alone
    plan = rules.plan(lengths)
    size = rules.batch_size
    assert size == DEFAULT_ACCELERATOR_BATCH_SIZE == 16
    # Every pass holds batch-size scenarios but the last, which holds the rest.
    assert [len(p) for p in plan[:-1]] == [size] * (len(plan) - 1)
    assert len(plan) == -(-len(lengths) // size)
    assert sorted(i for p in plan for i in p) == list(range(len(lengths)))
    # Longest first, as on the CPU: consecutive lengths share a pass, within the token budget.
    assert [lengths[i] for p in plan for i in p] == sorted(lengths, reverse=True)
    assert all(len(p) * lengths[p[0]] <= DEFAULT_MAX_BATCH_TOKENS for p in plan)
    # A caller's batch size is kept (16-bit included: no pass of one on an accelerator), as
    # far as the token budget allows the longest rows.
    wide = rules.plan(lengths, batch_size=64)
    assert len(wide[0]) == min(64, DEFAULT_MAX_BATCH_TOKENS // max(lengths)) > 16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(LENGTHS))
def test_cpu_plan_is_the_one_before(name: str, dtype: str) -> None:
    rules = batching_rules("cpu", dtype)
    assert rules.plan(LENGTHS[name]) == DATA["cpu_plans"][f"{name}/{dtype}"]


def test_cpu_rules_fill_and_16_bit_alone() -> None:
    demo = LENGTHS["demo"]
    fp32, bf16, fp16 = (batching_rules("cpu", d) for d in DTYPES)
    assert fp32.device_kind == CPU and fp32.batch_size == DEFAULT_BATCH_SIZES["cpu"] == 8
    assert fp32.min_fill == FORWARD_MIN_FILL == 0.9 and not fp32.alone
    assert bf16.alone and fp16.alone
    assert {len(p) for p in bf16.plan(demo, batch_size=8)} == {1}
    assert fp32.rows(4) == 4 and bf16.rows(4) == 1
    for lengths in LENGTHS.values():
        for p in fp32.plan(lengths):
            assert sum(lengths[i] for i in p) >= FORWARD_MIN_FILL * padded_tokens(lengths, [p])
    # A prefetch window (a chunk of 16 scenarios in benchmark order): within the same rows,
    # the CPU's fill rule splits it where the accelerator runs one pass and pads more.
    gpu = batching_rules("cuda", "float32")
    smol = LENGTHS["smol"][:16]
    cpu_plan, gpu_plan = fp32.plan(smol, batch_size=16), gpu.plan(smol)
    assert len(gpu_plan) == 1 < len(cpu_plan)
    assert padded_tokens(smol, gpu_plan) > padded_tokens(smol, cpu_plan)


def test_device_kinds_and_descriptions() -> None:
    assert [device_kind(d) for d in ("cpu", "cuda", "cuda:3", "mps", ACCELERATOR)] == [
        CPU,
        ACCELERATOR,
        ACCELERATOR,
        ACCELERATOR,
        ACCELERATOR,
    ]
    assert batching_rules("cpu", "float32").describe() == (
        "cpu: up to 8 scenarios a pass, at least 90% real tokens"
    )
    assert batching_rules("cpu", "bfloat16").describe() == (
        "cpu: up to 1 scenario a pass (16-bit on the CPU: one scenario a pass), "
        "at least 90% real tokens"
    )
    assert batching_rules("cuda", "bfloat16").describe(32) == (
        "accelerator: up to 32 scenarios a pass, no fill rule"
    )
