"""Wilson intervals and the exact McNemar test against published and hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_memeval.core.stats import describe_p, mcnemar_exact, wilson_interval


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I,
# method 3 (Wilson score interval without continuity correction).
@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=5e-5)
    assert hi == pytest.approx(high, abs=5e-5)


def test_wilson_at_the_ends_is_exact() -> None:
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    # 10/10 still has a real lower bound (the Wald interval would collapse to [1, 1]).
    assert wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=5e-5)


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (0, 0)])
def test_wilson_rejects_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_estimate(kn: tuple[int, int]) -> None:
    k, n = kn
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


@pytest.mark.parametrize(
    ("fixed", "broken", "p"),
    [
        (4, 2, 44 / 64),  # 2 * (C(6,0)+C(6,1)+C(6,2)) / 2^6
        (1, 6, 16 / 128),  # 2 * (1 + 7) / 2^7
        (0, 10, 2 / 1024),
        (5, 5, 1.0),  # the doubled tail exceeds 1: capped
        (0, 0, 1.0),  # no discordant pair: no evidence
    ],
)
def test_mcnemar_exact_values(fixed: int, broken: int, p: float) -> None:
    assert mcnemar_exact(fixed, broken) == pytest.approx(p, rel=1e-12)


@given(st.integers(0, 300), st.integers(0, 300))
def test_mcnemar_is_symmetric_and_a_probability(b: int, c: int) -> None:
    p = mcnemar_exact(b, c)
    assert p == mcnemar_exact(c, b)
    assert 0.0 < p <= 1.0
    if b + c:
        # the brute-force sum over the outcome distribution, from the definition
        n = b + c
        obs = math.comb(n, min(b, c))
        direct = sum(math.comb(n, i) for i in range(n + 1) if math.comb(n, i) <= obs) / 2**n
        assert p == pytest.approx(min(1.0, direct), rel=1e-9)


def test_describe_p_in_words() -> None:
    assert describe_p(0.6875) == "p = 0.6875: not significant at 0.05"
    assert describe_p(0.001953125) == "p = 0.001953: significant at 0.05"
    assert describe_p(0.03, alpha=0.01).endswith("not significant at 0.01")
