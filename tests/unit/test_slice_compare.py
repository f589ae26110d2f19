"""``memeval compare`` by slice: paired tests per slice, one family, verdicts in words."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.stats import holm, mcnemar_exact, normal_quantile, paired_diff_interval
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import compare_slices, load_run

from ..runfactory import make_record, write_run

N = 120
KINDS = ("door", "recent", "older")


def _tags(i: int, extra: Sequence[str] = ()) -> list[str]:
    return [f"query:{KINDS[i % 3]}"] + (["long"] if i < 60 else []) + list(extra)


def _run(
    root: Path,
    name: str,
    wrong: set[int] = frozenset(),  # type: ignore[assignment]
    extra: dict[int, list[str]] | None = None,
    turn_wrong: set[int] = frozenset(),  # type: ignore[assignment]
) -> Path:
    records = []
    for i in range(N):
        rec = make_record(
            f"s{i:03d}",
            i,
            final_match=i not in wrong,
            turn_matches=[i not in turn_wrong, True],
        )
        rec["tags"] = _tags(i, (extra or {}).get(i, ()))
        records.append(rec)
    return write_run(root / name, records, ckpt=name)


def _door_broken() -> set[int]:
    """20 of the 40 door scenarios, none of them 'long' (so only that slice changes)."""
    return {i for i in range(60, N) if i % 3 == 0}


def test_a_drop_in_one_slice_is_flagged_and_the_others_are_not(tmp_path: Path) -> None:
    a = load_run(_run(tmp_path, "a"))
    b = load_run(_run(tmp_path, "b", wrong=_door_broken()))
    result = compare_slices(a, [b], ["a", "b"])
    rows = {row["slice"]: row for row in result["pairs"][0]["slices"]}
    assert list(rows) == ["long", "query:door", "query:older", "query:recent"]
    door = rows["query:door"]
    assert (door["n"], door["fixed"], door["broken"]) == (40, 0, 20)
    assert door["m1_delta_pp"] == -50.0
    assert door["m1_p"] == mcnemar_exact(0, 20)
    # Newcombe's paired interval at the Bonferroni level of the family (8 tests).
    z = normal_quantile(1 - 0.05 / 8 / 2)
    low, high = paired_diff_interval(20, 0, 20, 0, z)
    assert door["m1_delta_ci_pp"] == [low * 100, high * 100]
    assert -100 < low * 100 < -50 < high * 100 < 0
    # 4 m1 tests and 4 m2 tests (every scenario's turns are comparable): one family of 8.
    corr = result["correction"]
    assert (corr["tests"], corr["m1_tests"], corr["m2_tests"]) == (8, 4, 4)
    assert corr["method"] == "holm" and corr["mde_alpha"] == 0.05 / 8
    assert door["m1_p_adjusted"] == pytest.approx(8 * door["m1_p"])
    assert door["m1_significant"] is True
    assert door["verdict"] == f"m1 drop of 50.0 pp, adjusted p={8 * door['m1_p']:.2g}"
    for tag in ("long", "query:older", "query:recent"):
        row = rows[tag]
        assert row["m1_significant"] is False and row["m2_significant"] is False
        assert row["verdict"].startswith(f"no detectable difference at n={row['n']} (m1 ")
        assert row["m1_mde_basis"].startswith("best case")
    assert rows["long"]["m1_mde_pp"] is not None and rows["long"]["m1_mde_pp"] > 10


def test_a_slice_significant_alone_is_not_flagged_after_correction(tmp_path: Path) -> None:
    # 6 of the 'older' scenarios broken: p = 2/64 = 0.031 alone, 8 * 0.031 after Holm.
    broken = {i for i in range(N) if i % 3 == 2 and i >= 60}
    broken = set(sorted(broken)[:6])
    a = load_run(_run(tmp_path, "a"))
    b = load_run(_run(tmp_path, "b", wrong=broken))
    rows = {r["slice"]: r for r in compare_slices(a, [b], ["a", "b"])["pairs"][0]["slices"]}
    older = rows["query:older"]
    assert older["m1_p"] == pytest.approx(0.03125) and older["m1_significant"] is False
    assert older["verdict"] == (
        "no detectable difference at n=40: significant alone, not after correcting for 8 tests "
        "(m1 raw p=0.031, adjusted 0.25)"
    )


def test_m2_per_slice_is_paired_and_in_the_family(tmp_path: Path) -> None:
    # B gets the first turn of every 'recent' scenario wrong: m2 drops there only.
    recent = {i for i in range(N) if i % 3 == 1}
    a = load_run(_run(tmp_path, "a"))
    b = load_run(_run(tmp_path, "b", turn_wrong=recent))
    rows = {r["slice"]: r for r in compare_slices(a, [b], ["a", "b"])["pairs"][0]["slices"]}
    m2 = rows["query:recent"]["m2"]
    assert (m2["scenarios"], m2["turns"], m2["changed"]) == (40, 80, 40)
    assert m2["delta_pp"] == -50.0
    assert rows["query:recent"]["m2_significant"] is True
    assert rows["query:recent"]["verdict"].startswith("m2 drop of 50.0 pp over 40 scenarios'")
    assert rows["query:door"]["m2"]["delta_pp"] == 0.0
    assert rows["query:door"]["verdict"].startswith("no detectable difference")


def test_a_tag_of_either_run_puts_the_scenario_in_the_slice(tmp_path: Path) -> None:
    # Only B knows 'oracle:x' (like the oracle variant's door changes): the slice exists, its
    # scenarios are those B tags, and the output says the runs tag scenarios differently.
    extra = {i: ["oracle:x"] for i in range(0, 30)}
    a = load_run(_run(tmp_path, "a"))
    b = load_run(_run(tmp_path, "b", extra=extra))
    pair = compare_slices(a, [b], ["a", "b"], slices=["oracle:x", "oracle:x&query:door"])["pairs"][
        0
    ]
    assert pair["tags_differ"] == 30
    assert [(r["slice"], r["n"]) for r in pair["slices"]] == [
        ("oracle:x", 30),
        ("oracle:x&query:door", 10),
    ]


def test_many_runs_form_one_family(tmp_path: Path) -> None:
    a = load_run(_run(tmp_path, "a"))
    b = load_run(_run(tmp_path, "b", wrong=_door_broken()))
    c = load_run(_run(tmp_path, "c"))
    result = compare_slices(a, [b, c], ["a", "b", "c"], method="bh")
    assert result["correction"]["tests"] == 16
    assert [p["b"] for p in result["pairs"]] == ["b", "c"]
    raw = [r["m1_p"] for p in result["pairs"] for r in p["slices"]]
    raw += [r["m2"]["p_value"] for p in result["pairs"] for r in p["slices"]]
    assert all(p is not None for p in raw)
    door = result["pairs"][0]["slices"][1]
    # BH: the smallest of 16 p-values is multiplied by 16 / 1.
    assert door["m1_p_adjusted"] == pytest.approx(min(1.0, 16 * door["m1_p"]))
    assert holm([1.0] * 3) == [1.0] * 3


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_compare_prints_the_slices_and_json_carries_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b", wrong=_door_broken())
    status, out, _ = _cli(["compare", str(a), str(b)], capsys)
    assert status == 0
    assert (
        "slices: a scenario is in a slice when either run's record carries the tag; p-values "
        "Holm-adjusted over the 8 tests shown (4 m1, 4 m2: Holm (1979) step-down: family-wise "
        "error rate at 0.05)"
    ) in out
    door = next(line for line in out.splitlines() if line.startswith("query:door "))
    assert "40/40 = 100.00%" in door and "20/40 = 50.00%" in door and "-50.00 pp" in door
    assert "0/20" in door
    assert "verdicts (B - A):" in out
    assert "  query:door    m1 drop of 50.0 pp, adjusted p=1.5e-05" in out
    status, out, _ = _cli(["compare", str(a), str(b), "--json", "--slice", "query:*"], capsys)
    data: dict[str, Any] = json.loads(out)
    assert data["m1_delta_pp"] == pytest.approx(-20 / 120 * 100)  # the whole comparison
    slices = data["slices"]
    assert [r["slice"] for r in slices["pairs"][0]["slices"]] == [
        "query:door",
        "query:older",
        "query:recent",
    ]
    assert slices["correction"]["tests"] == 6  # the slices shown are the family


def test_compare_refuses_a_slice_no_scenario_carries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    status, out, err = _cli(["compare", str(a), str(b), "--slice", "query:dor"], capsys)
    assert status == 2 and out == ""
    assert err.startswith("memeval compare: refused: slice 'query:dor': no scenario carries")
    assert "the tags are: long, query:door, query:older, query:recent" in err


def test_untagged_runs_compare_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [make_record(f"s{i}", i, final_match=True) for i in range(5)]
    a, b = (
        write_run(tmp_path / "a", records, ckpt="a"),
        write_run(tmp_path / "b", records, ckpt="b"),
    )
    status, out, _ = _cli(["compare", str(a), str(b)], capsys)
    assert status == 0 and "slices" not in out
    status, out, _ = _cli(["compare", str(a), str(b), "--json"], capsys)
    assert json.loads(out)["slices"] is None
