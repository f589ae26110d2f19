"""One gate check: a rate against a threshold, or against a reference run's, exactly.

The checks of the whole benchmark (:mod:`pytest_memeval.tools.gate`) and of its slices
(:mod:`pytest_memeval.tools.gate.slices`) are made here, in fractions (17/20 passes 0.85),
each with the line that explains it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest

from pytest_memeval.core.formatting import percent

__all__ = [
    "GateCheck",
    "drop_check",
    "parse_pp",
    "parse_rate",
    "pct",
    "pp",
    "threshold_check",
]


@dataclass(frozen=True)
class GateCheck:
    """One gate's verdict and the line that explains it."""

    name: str
    passed: bool
    detail: str


def pct(value: Fraction) -> str:
    """A rate as the gate prints it: ``85.00%``."""
    return percent(float(value))


def pp(value: Fraction) -> str:
    """Percentage points as the gate prints them: ``1.50 pp``."""
    return f"{float(value):.2f} pp"


def threshold_check(name: str, correct: int, total: int, minimum: Fraction) -> GateCheck:
    """``name`` (``correct`` of ``total``) must reach ``minimum``; nothing scored fails."""
    label = f"{name} >= {pct(minimum)}"
    if not total:
        return GateCheck(label, False, f"{label}: nothing scored for {name}, cannot pass")
    rate = Fraction(correct, total)
    margin = (rate - minimum) * 100
    got = f"{pct(rate)} ({correct}/{total})"
    if rate >= minimum:
        return GateCheck(label, True, f"{label}: {got}, {pp(margin)} above the threshold")
    return GateCheck(label, False, f"{label}: {got}, {pp(-margin)} below the threshold")


def drop_check(
    name: str,
    ours: tuple[int, int],
    ref: tuple[int, int],
    ref_path: Path,
    max_drop: Fraction,
) -> GateCheck:
    """``name`` (``ours``: correct, total) may be at most ``max_drop`` pp below the reference
    run's (``ref``, of the run in ``ref_path``); a run that scored nothing fails."""
    label = f"{name} drop vs baseline <= {pp(max_drop)}"
    if not ours[1]:
        return GateCheck(label, False, f"{label}: this run scored no {name}, so it cannot pass")
    ref_rate = Fraction(ref[0], ref[1])
    rate = Fraction(ours[0], ours[1])
    drop = (ref_rate - rate) * 100
    where = f"{pct(rate)} vs {pct(ref_rate)} in {ref_path}"
    change = f"dropped {pp(drop)}" if drop > 0 else f"rose {pp(-drop)}"
    if drop <= max_drop:
        return GateCheck(label, True, f"{label}: {where}: {change}, within the limit")
    return GateCheck(
        label, False, f"{label}: {where}: {change}, {pp(drop - max_drop)} over the limit"
    )


# -- the values of the gate options --------------------------------------------------------


def parse_rate(text: str, option: str) -> Fraction:
    """``0.85`` or ``85%`` -> 17/20, exactly (no float rounding at the threshold)."""
    raw = text.strip()
    percent_sign = raw.endswith("%")
    try:
        value = Fraction(raw[:-1].strip() if percent_sign else raw)
    except (ValueError, ZeroDivisionError):
        raise pytest.UsageError(f"{option} {text!r}: not a number (use e.g. 0.85 or 85%)") from None
    if percent_sign:
        value /= 100
    if not 0 <= value <= 1:
        raise pytest.UsageError(
            f"{option} {text!r}: a rate must lie between 0 and 1 (write 85% or 0.85 for 85 percent)"
        )
    return value


def parse_pp(text: str, option: str) -> Fraction:
    """``5`` or ``5pp`` -> 5 percentage points, exactly; between 0 and 100."""
    try:
        value = Fraction(text.strip().removesuffix("pp").strip())
    except (ValueError, ZeroDivisionError):
        raise pytest.UsageError(f"{option} {text!r}: not a number of percentage points") from None
    if not 0 <= value <= 100:
        raise pytest.UsageError(f"{option} {text!r}: must lie between 0 and 100 percentage points")
    return value
