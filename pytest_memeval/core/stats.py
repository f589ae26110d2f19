"""Small, exact statistics for comparing runs (formulas and references: docs/statistics.md).

Wilson intervals (m1), cluster-robust intervals of a mean over clustered items (m2: turns
clustered by scenario), the exact McNemar test and Newcombe's paired interval (m1 deltas), an
exact paired sign-flip permutation test (m2 deltas), Connor's minimum detectable difference
(power) and Holm's correction (many runs against one baseline).

Implemented here (no scipy) because each is a few lines and must be exactly reproducible:
tests and p-values use integer arithmetic, so a p-value does not drift with the float
library; the normal quantile is the standard library's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.records import RateBlock

__all__ = [
    "CLUSTER_METHOD",
    "CORRECTIONS",
    "METHOD_WORDS",
    "WILSON_METHOD",
    "WILSON_SCENARIOS_METHOD",
    "WILSON_TURNS_METHOD",
    "Z95",
    "ClusterSums",
    "adjust_p",
    "benjamini_hochberg",
    "cluster_se",
    "clustered_rate_with_ci",
    "describe_p",
    "holm",
    "interval_words",
    "mcnemar_exact",
    "mde_paired_binary",
    "min_detectable_drop",
    "normal_quantile",
    "paired_diff_interval",
    "rate_with_ci",
    "sign_flip_p",
    "wilson_interval",
]

#: The 0.975 quantile of the standard normal: a two-sided 95% interval.
Z95 = 1.959963984540054
#: ``ci95_method`` of a Wilson interval over independent outcomes (m1: one per scenario).
WILSON_METHOD = "wilson"
#: ``ci95_method`` of a clustered interval (m2: turns clustered by scenario): the
#: cluster-robust (sandwich) SE of the ratio estimator, normal 95% interval.
CLUSTER_METHOD = "cluster-sandwich"
#: ``ci95_method`` where the sandwich SE is 0: Wilson over the scenarios (see below).
WILSON_SCENARIOS_METHOD = "wilson-over-scenarios"
#: ``ci95_method`` with a single scenario: Wilson over its turns.
WILSON_TURNS_METHOD = "wilson-over-turns"
#: Each ``ci95_method`` in words.
METHOD_WORDS = {
    WILSON_METHOD: "Wilson",
    CLUSTER_METHOD: "clustered by scenario",
    WILSON_SCENARIOS_METHOD: "Wilson over scenarios (sandwich SE is 0)",
    WILSON_TURNS_METHOD: "Wilson over turns (one scenario)",
}


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


def rate_with_ci(correct: int, total: int) -> RateBlock:
    """``{correct, total, rate, ci95, ci95_method}``: a count with its rate and 95% Wilson
    interval (``rate`` and ``ci95`` null when nothing was scored)."""
    if not total:
        return {
            "correct": correct,
            "total": total,
            "rate": None,
            "ci95": None,
            "ci95_method": None,
        }
    return {
        "correct": correct,
        "total": total,
        "rate": correct / total,
        "ci95": list(wilson_interval(correct, total)),
        "ci95_method": WILSON_METHOD,
    }


# -- clustered intervals (m2) ----------------------------------------------------------------


def normal_quantile(p: float) -> float:
    """The ``p`` quantile of the standard normal (the standard library's inverse CDF)."""
    return NormalDist().inv_cdf(p)


@dataclass(frozen=True)
class ClusterSums:
    """Integer sums over clusters that a clustered mean and its sandwich variance need.

    For clusters ``c`` with ``n_c`` scored items whose scores sum to ``y_c`` (``y_c`` may be
    negative: a paired difference), the sums are ``G`` (clusters), ``N = sum n_c``,
    ``S = sum y_c``, ``Syy = sum y_c^2``, ``Syn = sum y_c n_c`` and ``Snn = sum n_c^2``. They
    stream (one scenario at a time) and stay integers, so the interval is reproducible
    exactly: the recount recomputes the same sums from ``predictions.jsonl``.
    """

    clusters: int = 0
    n: int = 0
    s: int = 0
    syy: int = 0
    syn: int = 0
    snn: int = 0

    def add(self, y: int, size: int) -> ClusterSums:
        """These sums with one more cluster of ``size`` items scoring ``y`` in all."""
        return ClusterSums(
            self.clusters + 1,
            self.n + size,
            self.s + y,
            self.syy + y * y,
            self.syn + y * size,
            self.snn + size * size,
        )

    @classmethod
    def of(cls, clusters: Iterable[tuple[int, int]]) -> ClusterSums:
        """The sums of ``(y_c, n_c)`` pairs (clusters with ``n_c == 0`` are skipped)."""
        out = cls()
        for y, size in clusters:
            if size:
                out = out.add(y, size)
        return out


def cluster_se(sums: ClusterSums) -> float | None:
    """Cluster-robust (sandwich) standard error of the ratio estimator ``S / N``.

    ``SE^2 = G/(G-1) * sum_c (y_c - m n_c)^2 / N^2`` with ``m = S/N``: Miller (2024,
    arXiv:2411.00640, eq. for the clustered SE; the cross terms of items in one cluster are
    what makes ``sum_c (y_c - m n_c)^2`` differ from the naive ``sum_i (s_i - m)^2``), times
    the usual small-sample factor ``G/(G-1)`` (Stata's and statsmodels' default for a mean;
    it matters below a few dozen clusters). Computed in exact integers until the square root.
    ``None`` with fewer than two clusters: one cluster has no between-cluster variance.
    """
    g, n = sums.clusters, sums.n
    if g < 2 or n <= 0:
        return None
    # N^2 * sum_c (y_c - (S/N) n_c)^2, expanded so that it stays an integer.
    v = n * n * sums.syy - 2 * sums.s * n * sums.syn + sums.s * sums.s * sums.snn
    var = Fraction(g, g - 1) * Fraction(v, n**4)
    return math.sqrt(var)


def clustered_rate_with_ci(correct: int, sums: ClusterSums) -> RateBlock:
    """``{correct, total, rate, ci95, ci95_method, clusters}`` for a mean of 0/1 scores in
    clusters (m2: turns clustered by scenario); ``sums`` are over the clusters' correct
    counts and sizes.

    The interval is ``rate +- z * SE`` with the cluster-robust SE (:func:`cluster_se`),
    clipped to [0, 1]. Where that SE is 0 or undefined it falls back to Wilson, said in
    ``ci95_method``: every turn right (or every turn wrong) has SE 0 although nothing is
    certain; then the Wilson interval over the ``G`` scenarios, as if each were one
    observation (the smallest effective sample size clustering can give, so the widest
    honest interval); the same wherever every scenario scored exactly the overall rate.
    With one scenario, Wilson over its turns (no clustering possible).
    """
    total = sums.n
    if not total:
        return {
            "correct": correct,
            "total": total,
            "rate": None,
            "ci95": None,
            "ci95_method": None,
            "clusters": 0,
        }
    rate = correct / total
    g = sums.clusters
    se = cluster_se(sums)
    if se is None:
        ci = list(wilson_interval(correct, total))
        method = WILSON_TURNS_METHOD
    elif se == 0.0:
        ci = list(wilson_interval(round(rate * g), g))
        method = WILSON_SCENARIOS_METHOD
    else:
        ci = [max(0.0, rate - Z95 * se), min(1.0, rate + Z95 * se)]
        method = CLUSTER_METHOD
    return {
        "correct": correct,
        "total": total,
        "rate": rate,
        "ci95": ci,
        "ci95_method": method,
        "clusters": g,
    }


# -- paired m2: exact sign-flip permutation test ---------------------------------------------


#: Bit operations the exact sign-flip count may take (about a second); beyond, the normal
#: approximation of the same permutation distribution.
_EXACT_BUDGET = 10**10


def sign_flip_p(differences: Sequence[int]) -> float:
    """Two-sided exact paired permutation (sign-flip) p-value of ``sum(differences)``.

    Under the null hypothesis the two runs are exchangeable within each scenario, so each
    scenario's difference ``d_c`` is as likely to have either sign (Fisher 1935; Good,
    "Permutation, Parametric and Bootstrap Tests of Hypotheses", 2005, ch. 3). The p-value is
    ``P(|T| >= |t_obs|)`` over all ``2^k`` sign assignments of the ``k`` non-zero
    differences, counted exactly (no sampling, no seed): ``T = 2P - A`` where ``P`` is the sum
    of the differences given a plus sign and ``A = sum |d_c|``, and the number of subsets per
    ``P`` is a coefficient of ``prod_c (1 + x^|d_c|)``, a polynomial multiplied here as one
    big integer (one slot of ``k + 2`` bits per power of ``x``). Beyond about a second of
    that (thousands of changed scenarios), the normal approximation of the same
    distribution.
    """
    values = [abs(int(d)) for d in differences if d]
    t_obs = abs(sum(int(d) for d in differences))
    if not values or t_obs == 0:
        return 1.0
    k, total = len(values), sum(values)
    width = k + 2
    if k * total * width > _EXACT_BUDGET:
        # Thousands of changed scenarios: the exact count would take minutes. T is then a
        # sum of many bounded independent terms, and the normal approximation of its
        # permutation distribution (mean 0, variance sum d_c^2; continuity correction 1,
        # half T's lattice step of 2) is accurate far beyond the digits a p-value is read to.
        z = (t_obs - 1) / math.sqrt(sum(v * v for v in values))
        return min(1.0, 2 * NormalDist().cdf(-z))
    poly = 1
    for v in values:
        poly += poly << (v * width)
    # Sign assignments with T >= t_obs: subsets with P >= (A + t_obs) / 2.
    first = -(-(total + t_obs) // 2)
    upper = poly >> (first * width)
    # The sum of the base-2^width digits of ``upper`` is its value modulo 2^width - 1, as
    # long as that sum (at most 2^k) stays below 2^width - 1, which width = k + 2 ensures.
    count = upper % ((1 << width) - 1)
    # The null distribution is symmetric: P(|T| >= t) = 2 P(T >= t) for t > 0.
    return float(min(Fraction(1), Fraction(2 * count, 2**k)))


# -- paired m1: interval of the difference, power --------------------------------------------


def paired_diff_interval(
    both: int, only_b: int, only_a: int, neither: int, z: float = Z95
) -> tuple[float, float]:
    """95% interval of ``p_B - p_A`` for paired binary outcomes (Newcombe 1998, method 10).

    Newcombe, "Improved confidence intervals for the difference between binomial proportions
    based on paired data", Stat. Med. 17:2635-2650 (1998); as given by Fagerland, Lydersen
    & Laake, "Statistical Analysis of Contingency Tables" (2017), section 8.5 (the
    "square-and-add" interval): the Wilson intervals of the two marginal rates combined with
    the estimated correlation ``phi`` of the pairs (with Newcombe's continuity adjustment of
    its numerator). ``only_b``: right in B only (fixed), ``only_a``: right in A only (broken).
    """
    n = both + only_b + only_a + neither
    if n <= 0:
        raise ValueError("paired_diff_interval: no pairs")
    b_right, a_right = both + only_b, both + only_a
    p_b, p_a = b_right / n, a_right / n
    l_b, u_b = wilson_interval(b_right, n, z)
    l_a, u_a = wilson_interval(a_right, n, z)
    margins = (b_right, n - b_right, a_right, n - a_right)
    if 0 in margins:
        phi = 0.0
    else:
        cross = both * neither - only_b * only_a
        if cross > n / 2:
            cross_adj = cross - n / 2
        elif cross >= 0:
            cross_adj = 0.0
        else:
            cross_adj = float(cross)
        phi = cross_adj / math.sqrt(math.prod(margins))
    d = p_b - p_a
    low = d - math.sqrt(
        max(0.0, (p_b - l_b) ** 2 + (u_a - p_a) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a))
    )
    high = d + math.sqrt(
        max(0.0, (p_a - l_a) ** 2 + (u_b - p_b) ** 2 - 2 * phi * (p_a - l_a) * (u_b - p_b))
    )
    return max(-1.0, low), min(1.0, high)


def _bisect(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of a decreasing ``f`` on ``[lo, hi]`` (``f(lo) > 0 >= f(hi)``)."""
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def mde_paired_binary(
    n: int, p_disc: float, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """Minimum detectable difference of two paired proportions (a share, not pp).

    Connor (1987), "Sample size for testing differences in proportions for the paired-sample
    design", Biometrics 43:207-211: with ``n`` pairs, a share ``p_disc`` of them discordant
    and a true difference ``delta``, the McNemar test at two-sided level ``alpha`` has power
    ``1 - beta`` when ``n delta^2 = (z_{1-alpha/2} sqrt(p_disc) + z_{1-beta}
    sqrt(p_disc - delta^2))^2``. Solved for ``delta`` (the left side grows and the right
    side shrinks with ``delta``, so one root on ``(0, sqrt(p_disc)]``). ``None`` when no
    difference is detectable: no discordant pairs, too few pairs for any, or so few
    discordant pairs that the exact test could not reject even if all went one way (below 6
    at alpha 0.05, where the normal approximation would still promise power).
    """
    if n <= 0 or p_disc <= 0:
        return None
    if mcnemar_exact(round(p_disc * n), 0) >= alpha:
        # Even if every discordant pair went one way the exact test could not reject: the
        # normal approximation behind Connor's formula would promise what cannot happen.
        return None
    za, zb = normal_quantile(1 - alpha / 2), normal_quantile(power)

    def gap(delta: float) -> float:
        rhs = za * math.sqrt(p_disc) + zb * math.sqrt(max(0.0, p_disc - delta * delta))
        return rhs - math.sqrt(n) * delta

    top = math.sqrt(p_disc)
    if gap(top) > 0:
        return None
    return _bisect(gap, 0.0, top)


def min_detectable_drop(n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest m1 difference ``n`` paired scenarios can detect in the best case.

    Connor's formula (:func:`mde_paired_binary`) with the least discordance a difference
    ``delta`` allows: ``p_disc = delta`` (every changed scenario changed the same way). Any
    real comparison, where some scenarios also change the other way, needs more. What the
    baseline's sample alone can resolve, before the candidate has run. ``None`` when even
    every scenario changing one way would not be significant in the exact test (n < 6).
    """
    if n <= 0 or mcnemar_exact(n, 0) >= alpha:
        return None  # not even all n scenarios changing one way would be significant
    za, zb = normal_quantile(1 - alpha / 2), normal_quantile(power)

    def gap(delta: float) -> float:
        rhs = za * math.sqrt(delta) + zb * math.sqrt(max(0.0, delta - delta * delta))
        return rhs - math.sqrt(n) * delta

    if gap(1.0) > 0:
        return None
    return _bisect(gap, 1e-12, 1.0)


# -- multiplicity --------------------------------------------------------------------------------


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, Scand. J. Statist. 6:65-70).

    Sort ascending; the i-th smallest (from 0) is multiplied by ``m - i``; running maximum so
    the adjusted values keep the order; capped at 1. Rejecting where the adjusted p < alpha
    controls the family-wise error rate at alpha under any dependence between the tests.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (Benjamini & Hochberg 1995, JRSS B 57:289-300).

    Sort ascending; the i-th smallest (from 1) is multiplied by ``m / i``; running minimum
    from the largest down so the adjusted values keep the order; capped at 1. Rejecting where
    the adjusted p < q controls the false discovery rate (the expected share of false
    findings among those flagged) at q for independent or positively dependent tests; it
    flags more than Holm, and promises less: not that no flag is false.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    out = [0.0] * m
    running = 1.0
    for k, i in enumerate(order):
        rank = m - k  # 1-based rank of p_values[i] in ascending order
        running = min(running, p_values[i] * m / rank)
        out[i] = min(1.0, running)
    return out


#: The corrections :func:`adjust_p` knows: name -> (function, what it controls, in words).
CORRECTIONS: dict[str, tuple[Callable[[Sequence[float]], list[float]], str]] = {
    "holm": (holm, "Holm (1979) step-down: family-wise error rate"),
    "bh": (benjamini_hochberg, "Benjamini-Hochberg (1995): false discovery rate"),
}


def adjust_p(p_values: Sequence[float], method: str = "holm") -> list[float]:
    """``p_values`` adjusted for multiplicity with ``method`` (a key of :data:`CORRECTIONS`)."""
    if method not in CORRECTIONS:
        raise ValueError(f"unknown correction {method!r} (one of {', '.join(CORRECTIONS)})")
    return CORRECTIONS[method][0](p_values)


# -- words ------------------------------------------------------------------------------------


def interval_words(block: RateBlock) -> str:
    """A rate block's interval with its method and sample, for a terminal line or a cell.

    ``95% CI [83.01%, 92.19%], Wilson over 189 scenarios`` (m1) or ``95% CI [75.91%,
    78.02%], clustered by scenario: 4223 turns in 189 scenarios`` (m2); ``""`` when the block
    has no interval.
    """
    ci = block.get("ci95")
    if not ci:
        return ""
    shown = f"95% CI [{percent(ci[0])}, {percent(ci[1])}]"
    method = str(block.get("ci95_method") or WILSON_METHOD)
    if "clusters" not in block:
        return f"{shown}, Wilson over {block['total']} scenarios"
    sample = f"{block['total']} turns in {block['clusters']} scenarios"
    return f"{shown}, {METHOD_WORDS.get(method, method)}: {sample}"
