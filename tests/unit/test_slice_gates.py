"""Per-slice gates through their public seams: values, checks, the power warnings."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from pytest_memeval.tools.gate import (
    Outcome,
    SliceGates,
    evaluate_slice_gates,
    outcomes,
    parse_rate,
    slice_limits,
    slice_warnings,
    split_values,
)

from ..runfactory import make_record

KNOWN = ["hard", "query:door", "query:where"]


def _outcomes(n: int, wrong: set[int], tags: dict[int, list[str]]) -> dict[str, Outcome]:
    records = []
    for i in range(n):
        rec = make_record(f"s{i:03d}", i, final_match=i not in wrong)
        rec["tags"] = tags.get(i, [])
        records.append(rec)
    return outcomes(records)  # type: ignore[arg-type]


def test_split_values() -> None:
    assert split_values(None, "--x") == (None, [])
    assert split_values(["0.8", "a=0.9", "b&c=1"], "--x") == ("0.8", ["a=0.9", "b&c=1"])
    with pytest.raises(pytest.UsageError, match="--x is given 2 values for the whole benchmark"):
        split_values(["0.8", "0.9"], "--x")


def test_slice_limits_expand_globs_and_refuse_unknown_slices() -> None:
    limits = slice_limits(["query:*=85%", "query:door&hard=0.5"], KNOWN, "--m", parse_rate)
    assert [(lim.spec.name, lim.value, lim.written) for lim in limits] == [
        ("query:door", Fraction(17, 20), "query:*=85%"),
        ("query:where", Fraction(17, 20), "query:*=85%"),
        ("query:door&hard", Fraction(1, 2), "query:door&hard=0.5"),
    ]
    with pytest.raises(pytest.UsageError, match=r"--m 'nope=0.5': slice 'nope': no scenario"):
        slice_limits(["nope=0.5"], KNOWN, "--m", parse_rate)
    with pytest.raises(pytest.UsageError, match=r"--m query:door '1.5': a rate must lie"):
        slice_limits(["query:door=1.5"], KNOWN, "--m", parse_rate)


def test_thresholds_and_drops_per_slice_are_exact() -> None:
    # 20 door scenarios (0..19), 3 wrong in this run: 17/20 = 85% exactly.
    tags = {i: ["query:door"] for i in range(20)} | {i: ["query:where"] for i in range(20, 40)}
    run = _outcomes(40, {0, 1, 2}, tags)
    base = _outcomes(40, set(), {})  # the baseline's records untagged: this run's tags count
    gates = SliceGates(
        min_m1=slice_limits(["query:door=0.85", "query:where=1"], KNOWN, "--m", parse_rate),
        max_drop=slice_limits(["query:door=15"], KNOWN, "--d", lambda t, o: Fraction(t)),
    )
    checks = evaluate_slice_gates(gates, run, base, Path("runs/ref"))
    assert [(c.name, c.passed) for c in checks] == [
        ("m1[query:door] >= 85.00%", True),
        ("m1[query:where] >= 100.00%", True),
        ("m1[query:door] drop vs baseline <= 15.00 pp", True),
        ("m2[query:door] drop vs baseline <= 15.00 pp", True),
    ]
    assert checks[2].detail == (
        "m1[query:door] drop vs baseline <= 15.00 pp: 85.00% vs 100.00% in runs/ref: dropped "
        "15.00 pp, within the limit"
    )
    tight = SliceGates(
        max_drop=slice_limits(["query:door=14"], KNOWN, "--d", lambda t, o: Fraction(t))
    )
    assert not evaluate_slice_gates(tight, run, base, Path("r"))[0].passed


def test_a_tag_only_the_baseline_carries_defines_the_slice() -> None:
    run = _outcomes(10, {0}, {})
    base = _outcomes(10, set(), {i: ["oracle:x"] for i in range(5)})
    gates = SliceGates(min_m1=slice_limits(["oracle:x=0.9"], ["oracle:x"], "--m", parse_rate))
    [check] = evaluate_slice_gates(gates, run, base, Path("r"))
    assert check.detail.startswith("m1[oracle:x] >= 90.00%: 80.00% (4/5), 10.00 pp below")


def test_power_warnings_per_slice() -> None:
    tags = {i: ["query:door"] for i in range(30)}
    run_tags = {f"s{i:03d}": frozenset(tags.get(i, [])) for i in range(60)}
    base = _outcomes(60, set(), tags)
    gates = SliceGates(
        min_m1=slice_limits(["query:door=0.8"], KNOWN, "--m", parse_rate),
        max_drop=slice_limits(["query:door=2"], KNOWN, "--d", lambda t, o: Fraction(t)),
    )
    before = slice_warnings(gates, run_tags, base)
    assert len(before) == 1
    assert before[0].startswith(
        "--memeval-max-drop query:door=2: 2 pp is smaller than what the slice's 30 scenarios "
        "can resolve: at 80% power and alpha 0.05, no m1 drop under"
    )
    # After the run: 8 of the 30 changed; 22/30 = 73.3% has 80% inside its interval.
    run = _outcomes(60, set(range(8)), tags)
    after = slice_warnings(gates, run_tags, base, run)
    assert any(
        w.startswith("slice query:door against the baseline: 8 of 30 scenarios") for w in after
    )
    assert any(
        w.startswith("m1[query:door] = 73.33% (22/30) has the threshold 80.00% inside its 95%")
        for w in after
    )
    # A large slice far from its threshold: no warning.
    wide = SliceGates(min_m1=slice_limits(["query:door=0.2"], KNOWN, "--m", parse_rate))
    assert slice_warnings(wide, run_tags, None, run) == []
