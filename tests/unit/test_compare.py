"""``memeval compare``: the seed's table from constructed runs, refusals, JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import CompareError, load_pair

from ..runfactory import SEED_BROKEN, SEED_FIXED, make_record, seed_runs, write_run


@pytest.fixture
def seed(tmp_path: Path) -> tuple[Path, Path]:
    return seed_runs(tmp_path)


def test_reproduces_the_seed_table(
    seed: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(seed[0]), str(seed[1])]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    base = next(line for line in lines if line.startswith("baseline "))
    oracle = next(line for line in lines if line.startswith("oracle "))
    # The seed's numbers, exactly as it printed them.
    assert "167/189 = 88.36%" in base and "0/189" in base
    assert "169/189 = 89.42%" in oracle and "165/189" in oracle
    assert "m1 delta (B - A): +1.06 pp (+2 scenarios)" in out
    assert "divergent: 165/189 scenarios" in out
    # 0 parse failures in both runs (final / turns).
    assert base.rstrip().endswith("0/0") and oracle.rstrip().endswith("0/0")
    # Wilson intervals, computed independently: 167/189 -> [83.01%, 92.19%].
    assert "[83.01%, 92.19%]" in base
    # The honest remark, with the test done: 4 fixed, 2 broken -> p = 44/64.
    assert "4 fixed, 2 broken, p = 0.6875: not significant at 0.05" in out
    assert "compatible with chance" in out
    assert f"fixed  (wrong in A, right in B): 4: {', '.join(map(repr, SEED_FIXED))}" in out
    assert f"broken (right in A, wrong in B): 2: {', '.join(map(repr, SEED_BROKEN))}" in out
    # Different benchmark files with the same ids: compared, and said so.
    assert "different benchmarks (sha256:baseline-b1 vs sha256:oracle-b1)" in out


def test_json_carries_the_same_numbers(
    seed: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(seed[0]), str(seed[1]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["a"]["m1"]["correct"], data["a"]["m1"]["total"]) == (167, 189)
    assert (data["b"]["m1"]["correct"], data["b"]["m1"]["total"]) == (169, 189)
    assert round(data["m1_delta_pp"], 2) == 1.06
    assert data["divergent"]["count"] == 165
    assert data["a"]["parse_fail"] == {"final": 0, "turns": 0}
    assert data["mcnemar"]["p_value"] == 0.6875 and data["mcnemar"]["significant"] is False
    assert data["flips"] == {"fixed": list(SEED_FIXED), "broken": list(SEED_BROKEN)}
    assert data["same_benchmark"] is False
    assert data["a"]["m1"]["ci95"][0] == pytest.approx(0.830052, abs=1e-6)


def test_divergence_is_about_turn_content_not_only_count(tmp_path: Path) -> None:
    same = ["pick mug from counter", "place mug in sink"]
    other = ["pick mug from counter", "place mug in cabinet_left"]  # same length, new content
    a = write_run(
        tmp_path / "a",
        [
            make_record("s1", 0, final_match=True, targets=same),
            make_record("s2", 1, final_match=True, targets=same),
        ],
        ckpt="a",
    )
    b = write_run(
        tmp_path / "b",
        [
            make_record(
                "s1",
                0,
                final_match=True,
                targets=same,
                turn_preds=["x", "y"],
                turn_matches=[False, False],
            ),
            make_record("s2", 1, final_match=True, targets=other, chain=same),
        ],
        ckpt="b",
    )
    result = load_pair(a, b)
    # s1: different predictions, same structure -> not divergent; s2: a turn's content differs.
    assert result["divergent"]["ids"] == ["s2"]
    assert result["same_benchmark"] is True and result["notes"][-1].startswith("m2 is scored")


def test_refuses_different_scenario_sets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(
        tmp_path / "a", [make_record(f"s{i}", i, final_match=True) for i in range(3)], ckpt="a"
    )
    b = write_run(
        tmp_path / "b", [make_record(f"s{i}", i, final_match=True) for i in (0, 1, 7)], ckpt="b"
    )
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "different scenarios" in err
    assert f"1 only in {a}: 's2'" in err and f"1 only in {b}: 's7'" in err


def test_refuses_incomplete_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(
        tmp_path / "a", [make_record("s0", 0, final_match=True)], ckpt="a", missing=["s1"]
    )
    b = write_run(tmp_path / "b", [make_record("s0", 0, final_match=True)], ckpt="b")
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "incomplete run" in err and "1 scenario(s) have no result: 's1'" in err


def test_refuses_runs_that_fail_the_recount(seed: tuple[Path, Path]) -> None:
    metrics = json.loads((seed[1] / "metrics.json").read_text("utf-8"))
    metrics["m1"]["correct"] += 1  # a metrics.json that claims more than its predictions show
    (seed[1] / "metrics.json").write_text(json.dumps(metrics), "utf-8")
    with pytest.raises(CompareError, match="fails the recount"):
        load_pair(seed[0], seed[1])


def test_refuses_a_missing_directory(seed: tuple[Path, Path], tmp_path: Path) -> None:
    shutil.rmtree(seed[1])
    with pytest.raises(CompareError, match="not a run directory"):
        load_pair(seed[0], seed[1])


def test_same_ckpt_names_are_labelled_by_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recs = [make_record("s0", 0, final_match=True), make_record("s1", 1, final_match=False)]
    a = write_run(tmp_path / "first", recs, ckpt="demo")
    b = write_run(tmp_path / "second", recs, ckpt="demo")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "m1 delta (B - A): +0.00 pp (+0 scenarios)" in out
    assert "no scenario changed its m1 outcome" in out
    assert "note: different benchmarks" not in out
    assert any(line.startswith(str(a)) for line in out.splitlines())
