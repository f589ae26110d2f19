"""``memeval bench``: both decode paths on the same scenarios, one process, a verdict line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main

from ..conftest import ADAPTERS, BASE_MODEL, REPO
from ..envs import TWC_TOML, require_textworld

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


CLOSED_LOOP_LAST_LINE = re.compile(
    r"^fast/reference speedup: \d+\.\dx, trajectories identical: (yes|no)$"
)


def _closed_loop_profiles(tmp_path: Path) -> Path:
    """A pyproject with ``loop``: the demo checkpoint acting in TextWorld Express (twc)."""
    require_textworld()
    path = tmp_path / "pyproject.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [tool.memeval.ckpt.loop]
            model = "{BASE_MODEL.as_posix()}"
            adapter = "{(ADAPTERS / "oracle").as_posix()}"
            generation = {{ max_new_tokens = 6 }}
            env = {{ {TWC_TOML}, seeds = "0-9", max_steps = 6 }}
            """
        ),
        "utf-8",
    )
    return path


@pytest.mark.slow
def test_bench_on_a_closed_loop_profile_prints_both_times_the_floor_and_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profile's first 5 seeds in the real simulator, the fast policy stepping 3
    episodes together (two groups): every trajectory is the reference policy's. The fast
    policy's calibration is measured and stored in the cache directory, then reused."""
    profiles = _closed_loop_profiles(tmp_path)
    command = ["bench", "--profiles", str(profiles), "--profile", "loop", "-n", "5"]
    command += ["--episodes-together", "3", "--threads", "1", "--cache-dir", str(tmp_path)]
    code = main(command)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("memeval bench: profile loop, closed loop, 5 episodes ("), lines
    assert "twc, fold test, seeds 0-4, max_steps 6" in lines[0]
    reference = re.match(r"^reference: +([\d.]+) s  \((\d+) steps, one episode at a time", lines[1])
    assert reference, lines
    assert re.match(r"^fast: +[\d.]+ s  \(up to 3 episodes stepped together\)$", lines[2])
    steps = re.match(r"^  (\d+) steps: (\d+) from the kept cache, ", lines[3])
    assert steps and steps.group(1) == reference.group(2), lines
    assert int(steps.group(2)) > 0  # the kept caches decided steps
    passes = r"^  \d+ extension passes \(\d+ in one row\), \d+ batched generate calls; "
    assert re.match(passes + "seconds: ", lines[4]), lines
    # The calibration: measured now and stored in the cache directory, the fast time apart
    # from its reference calls after it.
    assert re.match(r"^calibration: measured now over 8 cached steps .*, stored in ", lines[5])
    assert re.match(r"^fast without calibration: +[\d.]+ s  \(\d+\.\dx the reference\)$", lines[6])
    floors = [x for x in lines if x.startswith("floor:")]
    assert len(floors) == 1, lines
    floor = re.match(
        r"^floor: +([\d.]+) s  one forward pass .*; fast path \d+\.\dx the floor$", floors[0]
    )
    assert floor and 0 < float(floor.group(1)) < float(reference.group(1)), lines
    match = CLOSED_LOOP_LAST_LINE.match(lines[-1])
    assert match and match.group(1) == "yes" and code == 0, lines
    # A second bench of the same model and setting reuses it, with the same trajectories.
    code = main(command)
    again = capsys.readouterr().out.strip().splitlines()
    assert re.match(r"^calibration: reused \(measured .* over 8 cached steps, stored in ", again[5])
    assert again[-1].endswith("trajectories identical: yes") and code == 0, again


def test_bench_refuses_scenario_options_on_a_closed_loop_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = _closed_loop_profiles(tmp_path)
    base = ["bench", "--profiles", str(profiles), "--profile", "loop"]
    assert main([*base, "--history", "model"]) == 2
    assert "closed-loop profile: every action is the model's own" in capsys.readouterr().err
    assert main([*base, "--episodes-together", "0"]) == 2
    assert "--episodes-together must be >= 1" in capsys.readouterr().err
