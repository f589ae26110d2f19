"""The margin guard's bound from measured disagreement: the fp32 floor is the measured one
on the CPU only (no model run)."""

from __future__ import annotations

import pytest

from pytest_memeval.decode.fast import (
    MARGINS,
    MIN_MARGINS,
    SAFETY,
    calibrated_bound,
    default_margin,
)


def test_fp32_floor_is_the_measured_one_on_cpu_and_the_fixed_one_elsewhere() -> None:
    tiny = [1e-5]
    assert calibrated_bound("float32", "first", tiny, [10.0])[0] == MIN_MARGINS["float32"]
    for device in ("cuda", "mps", "xpu"):
        assert calibrated_bound("float32", "first", tiny, [10.0], device)[0] == MARGINS["float32"]
    # A disagreement above the floor sets the bound on any device.
    big = [0.01]
    assert calibrated_bound("float32", "step", big, [1.0], "cuda")[0] == pytest.approx(
        SAFETY * 2 * 0.01
    )


def test_fp32_bound_is_absolute() -> None:
    assert calibrated_bound("float32", "generate", [1e-5], [12.0, 3.0])[1] == 0.0


def test_without_measurements_the_fixed_margin_applies() -> None:
    assert calibrated_bound("float32", "first", [], []) == (default_margin("float32"), 0.0)
    assert calibrated_bound("float32", "first", [], [], "cuda") == (MARGINS["float32"], 0.0)


def test_16_bit_bounds_are_relative_with_the_prior_as_minimum() -> None:
    absolute, ulps = calibrated_bound("bfloat16", "step", [], [])
    assert absolute == MIN_MARGINS["bfloat16"] and ulps == pytest.approx(SAFETY * 2 * 1.0)
    assert calibrated_bound("bfloat16", "step", [0.5], [4.0])[1] == pytest.approx(SAFETY * 2 * 4)
