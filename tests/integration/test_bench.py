"""``memeval bench``: both decode paths on the same scenarios, one process, a verdict line."""

from __future__ import annotations

import re

import pytest

from pytest_memeval.tools.cli import main

from ..conftest import REPO

LAST_LINE = re.compile(r"^fast/reference speedup: \d+\.\dx, predictions identical: (yes|no)$")


@pytest.mark.slow
def test_bench_prints_both_rates_the_growth_table_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "bench",
            "--profiles",
            str(REPO / "pyproject.toml"),
            "--profile",
            "oracle",
            "-n",
            "3",
            "--turns",
            "10",
            "--turns-n",
            "2",
            "--threads",
            "1",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("memeval bench: profile oracle, 3 scenarios")
    assert re.match(r"^reference: .* scenarios/s$", lines[1])
    assert re.match(r"^fast: .* scenarios/s .*batch \d+, margin", lines[2])
    assert any(re.match(r"^  handed to the reference call: \d+ of \d+ turns \(", x) for x in lines)
    floor = [x for x in lines if x.startswith("floor:")]
    assert len(floor) == 1 and re.search(
        r"; fast path \d+\.\dx the floor( \(\d+\.\dx without the calibration\))?$", floor[0]
    ), lines
    kinds = [x for x in lines if re.match(r"^    .*: max [\d.e-]+, p99 [\d.e-]+ over \d+ pos", x)]
    assert len(kinds) == 4, lines  # first, step, generate, verify
    # The calibration: measured now (and stored) or reused from the cache directory, and the
    # fast time apart from it.
    assert any(
        re.match(r"^calibration: (measured now, [\d.]+ s|reused \(measured )", x) for x in lines
    )
    assert any(re.match(r"^fast without calibration: +[\d.]+ s", x) for x in lines), lines
    growth = [line for line in lines if re.match(r"^\s+\d+\.\d\s+\d+\s", line)]
    assert len(growth) == 1 and growth[0].rstrip().endswith("yes")
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    # The exit status follows the verdict.
    assert (code == 0) == (match.group(1) == "yes")
    assert match.group(1) == "yes"


@pytest.mark.slow
def test_bench_in_bfloat16_calibrates_relative_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "--profiles",
            str(REPO / "pyproject.toml"),
            "--dtype",
            "bfloat16",
            "-n",
            "3",
            "--turns",
            "",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert "; bfloat16, eager attention" in out.splitlines()[0]
    assert "margin in ulps of the top logit" in out
    assert re.search(r"cached steps\): max .*; bound [\d.]+ ulp of the top logit", out)
    # The exact mode and why not: the demo's LoRA runs in fp32, batch-variant here, and is
    # too large a share of the tiny model to run row by row.
    mode = re.search(r"^  exact mode: (on: up to \d+ rows per step|off: .+)$", out, re.M)
    assert mode, out
    assert re.search(r"^  seconds: .* [\d.]+ exact steps, [\d.]+ calibration$", out, re.M)
    assert out.strip().splitlines()[-1].endswith("predictions identical: yes") and code == 0


def test_bench_refuses_an_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--profiles", str(REPO / "pyproject.toml"), "--profile", "nope"])
    assert code == 2
    err = capsys.readouterr().err
    assert "memeval bench: error:" in err and "nope" in err


def test_bench_refuses_a_replay_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--profiles", str(REPO / "pyproject.toml"), "--profile", "oracle-replay"])
    assert code == 2
    assert "has no model to decode with" in capsys.readouterr().err
