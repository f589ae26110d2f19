"""CI gates and known failures: unit checks, then end-to-end pytester runs.

End-to-end runs use the demo checkpoint once (a real model, so the gate is exercised on real
predictions) and otherwise a replay profile whose predictions are built here, so which items
fail is known without hard-coding anything about the demo model's accuracy.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.episode_records import episode_record, finalize_episode_run
from pytest_memeval.env import Episode, TerminationReason, parse_env_spec
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.gate import (
    Baseline,
    ExpectError,
    GateSettings,
    evaluate_gate,
    failed_items,
    load_known_failures,
    parse_rate,
    wrong_answer,
)

from ..conftest import MemevalProject, demo_records
from ..runfactory import make_record, write_crafted, write_run

# -- units ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.85", Fraction(17, 20)),
        ("85%", Fraction(17, 20)),
        (" 100 % ", Fraction(1)),
        ("0", Fraction(0)),
    ],
)
def test_parse_rate(text: str, value: Fraction) -> None:
    assert parse_rate(text, "--memeval-min-m1") == value


@pytest.mark.parametrize(("text", "message"), [("85", "between 0 and 1"), ("abc", "not a number")])
def test_parse_rate_refuses(text: str, message: str) -> None:
    with pytest.raises(pytest.UsageError, match=message):
        parse_rate(text, "--memeval-min-m1")


def _metrics(m1: tuple[int, int], m2: tuple[int, int], complete: bool = True) -> dict[str, Any]:
    return {
        "complete": complete,
        "m1": {"correct": m1[0], "total": m1[1]},
        "m2": {"correct": m2[0], "total": m2[1]},
    }


def test_threshold_is_exact_at_the_boundary() -> None:
    # 17/20 is exactly 85%: a float comparison could put it a hair below.
    checks = evaluate_gate(GateSettings(min_m1=parse_rate("0.85", "x")), _metrics((17, 20), (0, 0)))
    assert [c.passed for c in checks] == [True]
    assert checks[0].detail == "m1 >= 85.00%: 85.00% (17/20), 0.00 pp above the threshold"


def test_gate_details_say_by_how_much() -> None:
    base = Baseline(Path("runs/ref"), m1=(9, 10), m2=(50, 100))
    settings = GateSettings(
        min_m1=Fraction(9, 10), min_m2=Fraction(1, 2), baseline=base, max_drop=Fraction(5)
    )
    checks = evaluate_gate(settings, _metrics((8, 10), (0, 0)))
    details = [c.detail for c in checks]
    assert details[0] == "m1 >= 90.00%: 80.00% (8/10), 10.00 pp below the threshold"
    assert details[1] == "m2 >= 50.00%: nothing scored for m2, cannot pass"
    assert details[2] == (
        "m1 drop vs baseline <= 5.00 pp: 80.00% vs 90.00% in runs/ref: dropped 10.00 pp, "
        "5.00 pp over the limit"
    )
    assert len(checks) == 3  # no m2 drop check: this run scored no turns
    assert not any(c.passed for c in checks)


def test_gate_never_passes_an_incomplete_run() -> None:
    checks = evaluate_gate(
        GateSettings(min_m1=Fraction(0)), _metrics((5, 5), (1, 1), complete=False)
    )
    assert [c.passed for c in checks] == [False, True]
    assert "incomplete" in checks[0].detail


def test_wrong_answer() -> None:
    assert not wrong_answer(make_record("s", 0, final_match=True))
    assert wrong_answer(make_record("s", 0, final_match=False))
    assert wrong_answer(make_record("s", 0, final_match=True, turn_matches=[True, False]))
    unaligned = make_record("s", 0, final_match=True, chain=["a"], turn_matches=[False, False])
    assert not wrong_answer(unaligned)  # unaligned turns are not scored


def test_known_failures_from_run_file_and_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        make_record("s1", 0, final_match=False),
        make_record("s2", 1, final_match=True, turn_matches=[False, True]),
        make_record("s3", 2, final_match=True),
        make_record("s4", 3, final_match=True, chain=["x"], turn_matches=[False, False]),
    ]
    run = write_run(tmp_path / "ref", records, ckpt="ref")
    expected = ["test_final_query[s1]", "test_turns[s2]"]
    assert failed_items(records) == expected
    assert load_known_failures(run) == expected
    assert load_known_failures(run / "predictions.jsonl") == expected
    listing = tmp_path / "known.txt"
    assert main(["known-failures", str(run), "-o", str(listing)]) == 0
    assert load_known_failures(listing) == expected
    assert "2 item(s) written" in capsys.readouterr().out
    listing.write_text(
        "# known\ntest_eval.py::test_final_query[s1]  # a node id\n\nnot an item\n", "utf-8"
    )
    with pytest.raises(ExpectError, match=r"known\.txt:4: not an eval item name"):
        load_known_failures(listing)


# -- end to end ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memeval-min-m1", "0.5"], "--memeval-min-m1 need an evaluation: give --ckpt"),
        (["--ckpt", "crafted", "--memeval-min-m1", "85"], "a rate must lie between 0 and 1"),
        (
            ["--ckpt", "crafted", "--memeval-max-drop", "1"],
            "--memeval-max-drop needs --memeval-baseline",
        ),
        (["--ckpt", "crafted", "--memeval-baseline", "nowhere"], "nowhere: not a run directory"),
        (
            ["--ckpt", "crafted", "--memeval-expect", "nothing.txt"],
            "nothing.txt: no such run directory",
        ),
        (["--memeval-min-success", "0.5"], "--memeval-min-success need an evaluation"),
        (
            ["--ckpt", "crafted", "--memeval-min-success", "0.5"],
            "--memeval-min-success is for closed-loop runs (a profile with an env)",
        ),
        (
            ["--ckpt", "crafted", "--memeval-baseline", "episodes"],
            "episodes: an episode run (closed loop); the baseline of a scenario run must be",
        ),
    ],
)
def test_usage_errors(memeval_project: MemevalProject, args: list[str], message: str) -> None:
    recs = demo_records("baseline", 2)
    write_crafted(memeval_project, recs)
    _episode_run(memeval_project.path / "episodes")
    result = memeval_project.pytester.runpytest(*args)  # in process: refused before any item
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in "\n".join(result.errlines + result.outlines)


def _episode_run(path: Path) -> None:
    """A closed-loop run directory of one episode (written as the episode controller does)."""
    spec = parse_env_spec({"backend": "textworld_express", "game": "twc", "seeds": "0"})
    episode = Episode(0, TerminationReason.STEP_LIMIT, (), "room", (), 0.0)
    path.mkdir()
    finalize_episode_run(
        path,
        profile="twc",
        env=spec.as_plain(),
        fingerprints={},
        ids=["twc-0"],
        records={"twc-0": episode_record(spec, episode)},
        wall_s=None,
    )


@pytest.fixture
def crafted(memeval_project: MemevalProject) -> tuple[MemevalProject, list[dict[str, Any]]]:
    """4 aligned demo scenarios replayed: #2 has a wrong final answer, #3 a wrong turn."""
    recs = demo_records("baseline", 4)
    write_crafted(memeval_project, recs, wrong_final=[recs[1]["id"]], wrong_turn=[recs[2]["id"]])
    return memeval_project, recs


@pytest.mark.slow
def test_demo_model_gate_decides_and_html_shows_it(memeval_project: MemevalProject) -> None:
    """The real demo model with a gate it must pass: a certainly wrong final answer is
    reported as a failure but the exit status follows the gate."""
    recs = demo_records("oracle", 3)
    recs[0]["messages"][-1]["content"] = "zzz-no-such-place"  # no model can predict this
    memeval_project.write(recs)
    result = memeval_project.run("--ckpt", "demo", "--memeval-min-m1", "0", "--html=report.html")
    m = memeval_project.metrics("demo")
    assert m["complete"] and m["m1"]["correct"] < 3
    failed = result.parseoutcomes().get("failed", 0)
    assert failed >= 1
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*memeval gate*",
            f"PASS  m1 >= 0.00%: *({m['m1']['correct']}/3)*",
            f"{failed} eval item failure(s) are wrong answers*",
            "gate PASSED: exit status 0",
        ]
    )
    page = (memeval_project.path / "report.html").read_text("utf-8")
    # pytest-html embeds rows and extras as JSON in a data attribute: decode it.
    import html as _html
    import re

    blob = re.search(r'data-jsonblob="([^"]*)"', page)
    assert blob is not None
    data = json.loads(_html.unescape(blob.group(1)))
    extras = [
        e["content"]
        for test in data["tests"].values()
        for run in test
        for e in run["extras"]
        if "memeval-scenario" in e["content"]
    ]
    assert len(extras) == 6  # both items of each of the 3 scenarios
    assert any("zzz-no-such-place" in e and "final prompt ends" in e for e in extras)
    assert "memeval: demo" in page and "gate PASSED" in page
    assert f"{m['m1']['correct']}/3 = " in page


@pytest.mark.slow
def test_thresholds_and_baseline(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], tmp_path: Path
) -> None:
    project, recs = crafted
    # A reference run that got everything right, over the same scenarios.
    ref = write_run(
        tmp_path / "ref",
        [make_record(r["id"], i, final_match=True) for i, r in enumerate(recs)],
        ckpt="ref",
    )
    result = project.run(
        "--ckpt",
        "crafted",
        "--memeval-min-m1",
        "50%",
        "--memeval-min-m2",
        "0.9",  # one wrong turn out of the 4 scenarios' dozens stays above 90%
        # "=": pytest reads paths among the arguments before it knows plugin options, so a
        # separate path argument would move the rootdir (documented in compare-and-gate.md)
        f"--memeval-baseline={ref}",
        "--memeval-max-drop",
        "10",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    m2 = project.metrics("crafted")["m2"]
    result.stdout.fnmatch_lines(
        [
            "PASS  m1 >= 50.00%: 75.00% (3/4), 25.00 pp above the threshold",
            f"PASS  m2 >= 90.00%: *({m2['correct']}/{m2['total']})*above the threshold",
            f"FAIL  m1 drop vs baseline <= 10.00 pp: 75.00% vs 100.00% in {ref}: dropped 25.00 pp, "
            "15.00 pp over the limit",
            "gate FAILED: exit status 1",
        ]
    )


@pytest.mark.slow
def test_gate_fails_an_incomplete_run(crafted: tuple[MemevalProject, list[dict[str, Any]]]) -> None:
    project, recs = crafted
    result = project.run("--ckpt", "crafted", "--memeval-min-m1", "0", "-k", recs[0]["id"])
    assert result.parseoutcomes() == {"passed": 2, "deselected": 6}
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["FAIL  complete run: the run is incomplete*", "gate FAILED: exit status 1"]
    )


def _reference(tmp_path: Path, ids: list[str]) -> Path:
    """The reference run failed #1 (fixed since: XPASS) and #2 (still failing: XFAIL), not
    #3, whose wrong turn is therefore a new failure."""
    return write_run(
        tmp_path / "ref",
        [make_record(sid, i, final_match=i not in (0, 1)) for i, sid in enumerate(ids)],
        ckpt="ref",
    )


@pytest.mark.slow
def test_expect_known_failures(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], tmp_path: Path
) -> None:
    project, recs = crafted
    ids = [r["id"] for r in recs]
    ref = _reference(tmp_path, ids)
    result = project.run("--ckpt", "crafted", f"--memeval-expect={ref}", "-rxXf")
    assert result.parseoutcomes() == {"passed": 5, "failed": 1, "xfailed": 1, "xpassed": 1}
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # no gate: the new failure fails the run
    result.stdout.fnmatch_lines_random(
        [
            f"XFAIL test_eval.py::test_final_query[[]{ids[1]}[]] - known failure (in {ref})",
            f"XPASS test_eval.py::test_final_query[[]{ids[0]}[]] - known failure (in {ref})",
            f"FAILED test_eval.py::test_turns[[]{ids[2]}[]]*",
        ]
    )
    # The run directory is whole: xfail changes outcomes, not records.
    assert project.metrics("crafted")["m1"]["correct"] == 3


@pytest.mark.slow
def test_expect_and_gate_under_xdist(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """-n 2: the markers reach the workers (as a list of names); the gate forgives the
    one remaining wrong answer but not a failing non-eval test."""
    project, recs = crafted
    ids = [r["id"] for r in recs]
    ref = _reference(tmp_path, ids)
    project.pytester.makepyfile(test_other="def test_plumbing():\n    assert 1 + 1 == 3\n")
    result = project.run(
        "-n",
        "2",
        "--ckpt",
        "crafted",
        f"--memeval-expect={ref}",
        "--memeval-min-m1",
        "0.5",
        "-rxXf",
    )
    assert result.parseoutcomes() == {"passed": 5, "failed": 2, "xfailed": 1, "xpassed": 1}
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random(
        [
            f"XFAIL test_eval.py::test_final_query[[]{ids[1]}[]] - known failure*",
            f"XPASS test_eval.py::test_final_query[[]{ids[0]}[]] - known failure*",
            f"FAILED test_eval.py::test_turns[[]{ids[2]}[]]*",
            "FAILED test_other.py::test_plumbing*",
            "PASS  m1 >= 50.00%: 75.00% (3/4), 25.00 pp above the threshold",
            "1 eval item failure(s) are wrong answers*",
            "1 other failure(s)/error(s) fail the session whatever the gate says",
            "gate PASSED: exit status 1",
        ]
    )


def test_a_run_that_scored_nothing_fails_the_baseline_gate_cleanly() -> None:
    """Every selected scenario missing: m1 total 0 must be a FAIL, not a ZeroDivisionError."""
    base = Baseline(Path("runs/ref"), m1=(9, 10), m2=(50, 100))
    checks = evaluate_gate(
        GateSettings(baseline=base, max_drop=Fraction(5)), _metrics((0, 0), (0, 0), False)
    )
    assert [c.passed for c in checks] == [False, False]
    assert checks[1].detail == (
        "m1 drop vs baseline <= 5.00 pp: this run scored no m1, so it cannot pass"
    )
