"""The margin guard's bound from measured disagreement: the fp32 floor is the measured one
on the CPU only; a calibration is plain data (a JSON round trip) the bounds are built from,
and the bounds decide which decisions are trusted (no model run)."""

from __future__ import annotations

import json
import re

import pytest

from pytest_memeval.decode.fast import (
    MARGINS,
    MIN_MARGINS,
    SAFETY,
    Bounds,
    Calibration,
    Disagreement,
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


def _calibration(first: float = 2e-3, first_ulps: float = 4.0) -> Calibration:
    return Calibration(
        setting={"dtype": "float32", "device": "cpu", "adapters": None, "batch_size": 8},
        turns=3,
        measured={
            "first": Disagreement((1e-5, first), (1.0, first_ulps)),
            "verify": Disagreement((3e-6,), (0.5,)),
        },
    )


def test_a_calibration_is_plain_data_that_round_trips_through_json() -> None:
    calibration = _calibration()
    text = json.dumps(calibration.to_dict())
    assert Calibration.from_dict(json.loads(text)) == calibration
    # Kinds not measured read as empty.
    assert calibration.disagreement("step") == Disagreement()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"turns": -1}, "'turns'"),
        ({"turns": True}, "'turns'"),
        ({"setting": {"dtype": 1.5}}, "'setting'"),
        ({"measured": {"sideways": {"absolute": [], "ulps": []}}}, "unknown kind 'sideways'"),
        ({"measured": {"first": {"absolute": ["x"], "ulps": []}}}, "measured.first.absolute"),
        ({"measured": {"first": {"absolute": []}}}, "measured.first.ulps"),
    ],
)
def test_a_stored_calibration_that_is_not_one_is_refused(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Calibration.from_dict({**_calibration().to_dict(), **change})


def test_fp32_bounds_from_a_calibration_trust_exactly_from_the_bound_on() -> None:
    bounds = Bounds("float32", "cpu", calibration=_calibration())
    bound = SAFETY * 2 * 2e-3  # the largest first-token disagreement, above the floor
    assert bounds.absolute["first"] == pytest.approx(bound)
    assert bounds.trusted("first", bound, top=10.0)
    assert not bounds.trusted("first", bound * 0.999, top=10.0)
    # verify: measured below the floor; step, generate: not measured (the fixed margin)
    assert bounds.absolute["verify"] == MIN_MARGINS["float32"]
    assert bounds.absolute["step"] == bounds.absolute["generate"] == default_margin("float32")
    assert not bounds.relative and bounds.smallest == MIN_MARGINS["float32"]
    # The same from use() on a default Bounds.
    later = Bounds("float32", "cpu")
    assert later.absolute["first"] == default_margin("float32") and later.calibration is None
    later.use(_calibration())
    assert later.absolute == bounds.absolute and later.calibration == _calibration()


def test_a_fixed_margin_keeps_its_bounds_but_records_the_calibration() -> None:
    bounds = Bounds("float32", "cpu", margin=0.5, calibration=_calibration())
    assert set(bounds.absolute.values()) == {0.5}
    assert bounds.disagreement("first").absolute == (1e-5, 2e-3)


def test_16_bit_bounds_from_a_calibration_count_ulps_of_the_top_logit() -> None:
    bounds = Bounds("bfloat16", "cpu", calibration=_calibration(first_ulps=4.0))
    assert bounds.relative and bounds.ulps["first"] == pytest.approx(SAFETY * 2 * 4.0)
    # At a top logit of 10 one bfloat16 ulp is 2**-4: the bound is 12 ulps = 0.75.
    assert bounds.trusted("first", 0.75, top=10.0)
    assert not bounds.trusted("first", 0.6875, top=10.0)
    # ... and twice that at a top logit twice as large.
    assert not bounds.trusted("first", 0.75, top=20.0)
