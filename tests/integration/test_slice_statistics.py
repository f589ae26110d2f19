"""Per-slice comparison against statsmodels' multiple-testing corrections, and by simulation:
two runs of the same model differ only by chance, and the family-wise guarantee must hold.

The simulation is seeded (deterministic) and small enough for the inner loop: a few seconds.
"""

from __future__ import annotations

import gc
import importlib
import random
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.records import Record
from pytest_memeval.core.results import CheckedRun
from pytest_memeval.core.stats import adjust_p, benjamini_hochberg, holm
from pytest_memeval.tools.compare import SliceComparison, compare_slices

from ..runfactory import make_record


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


multitest = _optional("statsmodels.stats.multitest")
needs_statsmodels = pytest.mark.skipif(multitest is None, reason="statsmodels is not installed")

#: The simulated benchmark: 150 scenarios, their tags (three query kinds of 50, three length
#: buckets of 60, 60 and 30, two overlapping door tags of about 120 and 45: eight slices).
N = 150


def _benchmark(rng: random.Random) -> list[tuple[list[str], float, float, int]]:
    """Per scenario: tags, its chance of a right final answer, of a right turn, its turns.

    The chances vary a lot between scenarios (some easy, some hard), as on a real benchmark:
    two runs of one model then agree on most scenarios and differ on a few.
    """
    out = []
    for i in range(N):
        tags = [f"query:{('door', 'recent', 'older')[i % 3]}", f"chain:{1 + i % 5 // 2}"]
        if rng.random() < 0.8:
            tags.append("oracle:close-dropped")
        if rng.random() < 0.3:
            tags.append("oracle:open-inserted")
        out.append((tags, rng.betavariate(0.7, 0.5), rng.betavariate(2, 1), rng.randint(2, 9)))
    return out


def _run(
    name: str,
    bench: list[tuple[list[str], float, float, int]],
    rng: random.Random,
    shift: dict[str, float] | None = None,
) -> CheckedRun:
    """One run of the model: each outcome drawn afresh (``shift``: a tag's m1 chance moved)."""
    records: dict[str, Record] = {}
    for i, (tags, p_final, p_turn, turns) in enumerate(bench):
        p = p_final + sum(d for tag, d in (shift or {}).items() if tag in tags)
        targets = [f"pick mug from c{k}" for k in range(turns)]
        rec: Any = make_record(
            f"s{i:03d}",
            i,
            final_match=rng.random() < p,
            targets=targets,
            turn_matches=[rng.random() < p_turn for _ in targets],
        )
        rec["tags"] = tags
        records[rec["id"]] = rec
    return CheckedRun(path=Path(name), metrics={}, records=records)  # type: ignore[typeddict-item]


def _flags(result: SliceComparison, *, adjusted: bool) -> bool:
    """Whether any slice of the comparison is flagged (m1 or m2)."""
    for row in result["pairs"][0]["slices"]:
        if adjusted and (row["m1_significant"] or row["m2_significant"]):
            return True
        m2_p = row["m2"]["p_value"]
        if not adjusted and (row["m1_p"] < 0.05 or (m2_p is not None and m2_p < 0.05)):
            return True
    return False


def _simulate(seed: int, runs: int, method: str, shift: dict[str, float] | None = None) -> Any:
    rng = random.Random(seed)
    bench = _benchmark(rng)
    flagged = raw_flagged = 0
    tests = set()
    for _ in range(runs):
        a = _run("a", bench, rng)
        b = _run("b", bench, rng, shift)
        result = compare_slices(a, [b], ["a", "b"], method=method)
        tests.add(result["correction"]["tests"])
        flagged += _flags(result, adjusted=True)
        raw_flagged += _flags(result, adjusted=False)
    return flagged, raw_flagged, tests


@pytest.mark.slow
@pytest.mark.parametrize("method", ["holm", "bh"])
def test_the_same_model_twice_flags_no_slice_in_95_percent_of_comparisons(method: str) -> None:
    """Two runs of one model, outcomes drawn afresh (shuffled noise): at the 5% level, at
    most 5% of the comparisons may flag any slice (Holm controls the family-wise error; with
    nothing changed, every flag is false, so Benjamini-Hochberg's false discovery rate is the
    same guarantee); uncorrected, far more would."""
    runs = 250
    flagged, raw_flagged, tests = _simulate(seed=20261201, runs=runs, method=method)
    assert tests == {16}  # 8 slices, m1 and m2 each
    assert flagged <= 0.05 * runs, f"{flagged} of {runs} null comparisons flagged a slice"
    # Without the correction the table cries wolf: some raw p < 0.05 in many comparisons.
    assert raw_flagged >= 0.25 * runs, raw_flagged


def test_a_real_drop_in_one_slice_is_found() -> None:
    """The guarantee is not bought by never flagging: the 50 door scenarios' chance of a right
    answer 45 points lower (less where it was already below 45%) is flagged, after the
    correction, in most comparisons."""
    runs = 60
    flagged, _, _ = _simulate(seed=7, runs=runs, method="holm", shift={"query:door": -0.45})
    assert flagged >= 0.8 * runs, flagged


@needs_statsmodels
@pytest.mark.parametrize(("method", "reference"), [("holm", "holm"), ("bh", "fdr_bh")])
def test_adjustments_match_statsmodels_multipletests(
    method: str, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # statsmodels' multipletests runs gc.collect() on every call: 0.1-0.7 s each in a test
    # process that already holds torch's objects. Its results do not depend on it.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = random.Random(11)
    for _ in range(200):
        ps = [rng.random() ** 4 for _ in range(rng.randint(1, 20))]
        if len(ps) > 2 and rng.random() < 0.3:
            ps[1] = ps[0]  # ties
        expected = list(multitest.multipletests(ps, method=reference)[1])
        assert adjust_p(ps, method) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert holm is adjust_p.__globals__["CORRECTIONS"]["holm"][0]
    assert benjamini_hochberg is adjust_p.__globals__["CORRECTIONS"]["bh"][0]


@needs_statsmodels
@pytest.mark.parametrize(("method", "reference"), [("holm", "holm"), ("bh", "fdr_bh")])
def test_the_slice_table_is_adjusted_as_statsmodels_adjusts_its_p_values(
    method: str, reference: str
) -> None:
    """Every p-value shown (m1 then m2, over every slice) adjusted as one family."""
    rng = random.Random(3)
    bench = _benchmark(rng)
    a, b = _run("a", bench, rng), _run("b", bench, rng, {"query:door": -0.3})
    result = compare_slices(a, [b], ["a", "b"], method=method)
    rows = result["pairs"][0]["slices"]
    raw = [row["m1_p"] for row in rows] + [row["m2"]["p_value"] for row in rows]
    expected = list(multitest.multipletests(raw, method=reference)[1])
    got = [row["m1_p_adjusted"] for row in rows] + [row["m2_p_adjusted"] for row in rows]
    assert got == pytest.approx(expected, rel=1e-12)
    assert [row["m1_significant"] for row in rows] == [p < 0.05 for p in expected[: len(rows)]]
