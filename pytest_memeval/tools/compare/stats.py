"""The statistics of a comparison: each run's rates, and a pair's paired tests and power.

For a run (:func:`run_summary`): m1 with its 95% Wilson interval, m2 with its 95% interval
clustered by scenario. For a pair: the m1 difference's paired interval (Newcombe,
:func:`m1_delta_interval`), the exact McNemar test on the scenarios whose m1 outcome
differs (:func:`mcnemar`), the smallest m1 difference the pair could detect
(:func:`m1_power`), and m2 compared paired by scenario (:func:`paired_m2`). Each verdict is
stated in words at :data:`~pytest_memeval.tools.compare.types.ALPHA`. Formulas and
references: docs/statistics.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.history import history_of
from pytest_memeval.core.records import Fingerprints
from pytest_memeval.core.stats import (
    CLUSTER_METHOD,
    Z95,
    ClusterSums,
    cluster_se,
    clustered_rate_with_ci,
    describe_p,
    mcnemar_exact,
    mde_paired_binary,
    min_detectable_drop,
    paired_diff_interval,
    rate_with_ci,
    sign_flip_p,
)
from pytest_memeval.tools.compare.scenarios import scored_turns, turn_structure
from pytest_memeval.tools.compare.types import (
    ALPHA,
    POWER,
    McNemar,
    PairedM2,
    Power,
    RunData,
    RunSummary,
)

__all__ = ["m1_delta_interval", "m1_power", "mcnemar", "paired_m2", "pp_delta", "run_summary"]


def run_summary(label: str, run: RunData) -> RunSummary:
    """The per-run part of a comparison: counts, rates and 95% intervals, fingerprints.

    m1's interval is Wilson's (one outcome per scenario); m2's is clustered by scenario
    (``ci95_method`` says which, ``clusters`` how many scenarios its turns come from).
    """
    m = run.metrics
    m2_clusters = ClusterSums.of(scored_turns(rec) for rec in run.records.values())
    fingerprints: Fingerprints = m.get("fingerprints") or {}
    return {
        "label": label,
        "path": str(run.path),
        "ckpt": run.ckpt,
        "n": m["n"],
        "m1": rate_with_ci(m["m1"]["correct"], m["m1"]["total"]),
        "m2": clustered_rate_with_ci(m["m2"]["correct"], m2_clusters),
        "parse_fail": m["parse_fail"].copy(),
        "unaligned": m["unaligned"],
        "fingerprints": fingerprints.copy(),
        "m2_by_position": dict(m.get("m2_by_position") or {}),
        "history": history_of(m),
    }


def pp_delta(a: float | None, b: float | None) -> float | None:
    """``b - a`` in percentage points, or ``None`` where either rate is."""
    return None if a is None or b is None else (b - a) * 100.0


def m1_delta_interval(n: int, right_a: int, fixed: int, broken: int) -> list[float] | None:
    """The paired 95% interval of the m1 difference in pp (Newcombe), ``None`` for no
    scenarios; ``right_a`` scenarios right in A, ``fixed``/``broken`` those that flipped."""
    if not n:
        return None
    both_right = right_a - broken
    return [
        v * 100
        for v in paired_diff_interval(both_right, fixed, broken, n - both_right - fixed - broken)
    ]


def mcnemar(fixed: int, broken: int) -> McNemar:
    """The exact McNemar test of a pair on its ``fixed`` and ``broken`` scenarios."""
    p_value = mcnemar_exact(fixed, broken)
    return {
        "test": "exact McNemar (two-sided binomial on discordant scenarios)",
        "fixed": fixed,
        "broken": broken,
        "discordant": fixed + broken,
        "p_value": p_value,
        "alpha": ALPHA,
        "significant": p_value < ALPHA,
        "statement": describe_p(p_value, ALPHA),
    }


def m1_power(n: int, discordant: int, observed_pp: float | None) -> Power:
    """The minimum detectable m1 difference of a paired comparison, in numbers and words.

    Connor's formula (:func:`~pytest_memeval.core.stats.mde_paired_binary`) at the observed
    discordant share; where no scenario changed, the best case (every change one way,
    :func:`~pytest_memeval.core.stats.min_detectable_drop`) and the basis says so.
    """
    share = discordant / n if n else 0.0
    if discordant:
        mde = mde_paired_binary(n, share, ALPHA, POWER)
        basis = "observed discordant share"
        where = (
            f"with {n} scenarios and {percent(share, decimals=1)} of them ({discordant}) "
            "changing their m1 outcome"
        )
    else:
        mde = min_detectable_drop(n, ALPHA, POWER)
        basis = "no scenario changed: best case, every change in one direction"
        where = (
            f"no scenario changed its m1 outcome; even if every change went one way, {n} scenarios"
        )
    mde_pp = None if mde is None else mde * 100
    if mde_pp is None:
        statement = f"{where}: no m1 difference is detectable at {POWER:.0%} power"
    else:
        statement = (
            f"{where}, this comparison can only detect m1 differences of about {mde_pp:.1f} pp "
            f"or more ({POWER:.0%} power, alpha {ALPHA:g})"
        )
        if observed_pp is not None and discordant:
            below = abs(observed_pp) < mde_pp
            statement += f"; the observed {observed_pp:+.2f} pp is " + (
                "below that: too small for this sample to show" if below else "above that"
            )
    return {
        "mde_pp": mde_pp,
        "n": n,
        "discordant": discordant,
        "discordant_share": share,
        "alpha": ALPHA,
        "power": POWER,
        "basis": basis,
        "method": "Connor (1987) sample size for the paired (McNemar) design, solved for delta",
        "statement": statement,
    }


class _M2Differences(NamedTuple):
    """The scenarios m2 can be compared paired on: each one's ``(d_c, n_c)`` (B's right
    turns minus A's, over its scored turns) and the right turns of each run over them."""

    diffs: list[tuple[int, int]]
    right_a: int
    right_b: int


def _m2_differences(run_a: RunData, run_b: RunData, ids: Sequence[str]) -> _M2Differences:
    diffs: list[tuple[int, int]] = []
    right_a = right_b = 0
    for sid in ids:
        rec_a, rec_b = run_a.records[sid], run_b.records[sid]
        if rec_a.get("aligned") is not True or rec_b.get("aligned") is not True:
            continue
        if turn_structure(rec_a) != turn_structure(rec_b):
            continue
        scored_a = [t["match"] is not None for t in rec_a["turns"]]
        if scored_a != [t["match"] is not None for t in rec_b["turns"]] or not any(scored_a):
            continue
        ya, n_c = scored_turns(rec_a)
        yb, _ = scored_turns(rec_b)
        diffs.append((yb - ya, n_c))
        right_a += ya
        right_b += yb
    return _M2Differences(diffs, right_a, right_b)


def paired_m2(run_a: RunData, run_b: RunData, ids: Sequence[str]) -> PairedM2:
    """m2 compared paired by scenario, on the scenarios both runs score on the same turns.

    Comparable: aligned in both runs, the same turn structure
    (:func:`~pytest_memeval.tools.compare.scenarios.turn_structure`) and the same turns
    scored. Each such scenario gives ``d_c`` (B's right turns minus A's) over
    ``n_c`` turns; the delta is ``sum d_c / sum n_c``, its interval cluster-robust (the
    sandwich SE of that ratio, by scenario), its p-value the exact sign-flip permutation
    test of ``sum d_c``. Other scenarios are "not comparable" for m2 and counted.
    """
    found = _m2_differences(run_a, run_b, ids)
    diffs = found.diffs
    sums = ClusterSums.of(diffs)
    out: PairedM2 = {
        "scenarios": sums.clusters,
        "of": len(ids),
        "not_comparable": len(ids) - sums.clusters,
        "turns": sums.n,
        "changed": sum(1 for d, _ in diffs if d),
        "a": None,
        "b": None,
        "delta_pp": None,
        "ci95_pp": None,
        "ci95_method": None,
        "test": "exact paired sign-flip permutation test of the summed per-scenario differences",
        "p_value": None,
        "alpha": ALPHA,
        "significant": None,
        "statement": "no scenario is scored on the same turns in both runs: m2 not comparable",
    }
    if not sums.n:
        return out
    delta = sums.s / sums.n
    se = cluster_se(sums)
    p = sign_flip_p([d for d, _ in diffs])
    # No interval from one scenario, nor where every scenario differs alike (SE 0: the
    # sandwich would claim a point; say "n/a" rather than a certainty nobody has).
    ci = None if se is None or se == 0 else [(delta - Z95 * se) * 100, (delta + Z95 * se) * 100]
    out["a"] = found.right_a / sums.n
    out["b"] = found.right_b / sums.n
    out["delta_pp"] = delta * 100
    out["ci95_pp"] = ci
    out["ci95_method"] = None if ci is None else CLUSTER_METHOD
    out["p_value"] = p
    out["significant"] = p < ALPHA
    out["statement"] = describe_p(p, ALPHA)
    return out
