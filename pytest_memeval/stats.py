"""Small, exact statistics for comparing runs: Wilson intervals and the exact McNemar test.

Implemented here (no scipy) because both are a few lines and must be exactly reproducible:
the interval is the closed-form Wilson score interval, the test sums binomial terms with
integer arithmetic, so a p-value does not drift with the float library.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

__all__ = ["Z95", "describe_p", "mcnemar_exact", "rate_with_ci", "wilson_interval"]

#: The 0.975 quantile of the standard normal: a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson_interval(correct: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``correct`` successes out of ``total`` (default 95%).

    Unlike the normal ("Wald") interval it stays inside [0, 1] and does not collapse to a
    point at 0% or 100%, which matters for accuracies near 100% on a few hundred scenarios.
    """
    if total <= 0:
        raise ValueError("wilson_interval: total must be positive")
    if not 0 <= correct <= total:
        raise ValueError(f"wilson_interval: correct={correct} outside [0, {total}]")
    p = correct / total
    z2 = z * z
    denom = 1.0 + z2 / total
    centre = (p + z2 / (2 * total)) / denom
    half = z * math.sqrt(p * (1.0 - p) / total + z2 / (4.0 * total * total)) / denom
    # Clamp the rounding error at the ends (0/n and n/n give exactly 0 and 1).
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    high = 1.0 if correct == total else min(1.0, centre + half)
    return low, high


def mcnemar_exact(fixed: int, broken: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes.

    ``fixed`` and ``broken`` are the discordant pairs (wrong in A and right in B, and the
    reverse). Under the null hypothesis each discordant pair goes either way with
    probability 1/2, so the p-value is twice the smaller binomial tail, capped at 1. No
    discordant pairs means no evidence either way: p = 1.
    """
    if fixed < 0 or broken < 0:
        raise ValueError("mcnemar_exact: counts must be non-negative")
    n = fixed + broken
    if n == 0:
        return 1.0
    k = min(fixed, broken)
    tail = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


def describe_p(p: float, alpha: float = 0.05) -> str:
    """The p-value in words, e.g. ``"p = 0.6875: not significant at 0.05"``."""
    shown = f"{p:.4g}" if p >= 1e-4 else f"{p:.2e}"
    verdict = "significant" if p < alpha else "not significant"
    return f"p = {shown}: {verdict} at {alpha:g}"


def rate_with_ci(correct: int, total: int) -> dict[str, Any]:
    """``{correct, total, rate, ci95}``: a count with its rate and 95% Wilson interval
    (``rate`` and ``ci95`` null when nothing was scored)."""
    if not total:
        return {"correct": correct, "total": total, "rate": None, "ci95": None}
    return {
        "correct": correct,
        "total": total,
        "rate": correct / total,
        "ci95": list(wilson_interval(correct, total)),
    }
