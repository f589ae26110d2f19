"""Wrong answers take one line each by default; pytest's usual options still give full reports.

Runs are model-free (``replay`` profile) pytest subprocesses in a project directory of their own.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from pytest_memeval.core.ids import item_name

from ..conftest import EVAL_MODULE, INNER_ADDOPTS, write_jsonl
from ..runfactory import benchmark_with_ids, replay_prediction

# Slow: every test runs pytest subprocesses on a replay project.
pytestmark = pytest.mark.slow

IDS = ["s0001", "café 1", "a/b#2 [x]", "s0004", "Straße:3", "s0006"]
WRONG = {"café 1", "s0004", "Straße:3"}  # final answers replayed wrong


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    root = Path(pytester.path)
    records = benchmark_with_ids(IDS)
    bench = write_jsonl(root / "bench.jsonl", records)
    preds = [replay_prediction(r, right=r["id"] not in WRONG) for r in records]
    write_jsonl(root / "preds.jsonl", preds)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.pytest.ini_options]
            addopts = "{INNER_ADDOPTS}"

            [tool.memeval.ckpt.r]
            kind = "replay"
            predictions = "{(root / "preds.jsonl").as_posix()}"
            benchmark = "{bench.as_posix()}"
            """
        ),
        "utf-8",
    )
    (root / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    # A failure that is not a wrong answer is never shortened.
    (root / "test_other.py").write_text(
        "def test_plumbing():\n    assert 1 + 1 == 3, 'plumbing broke'\n", "utf-8"
    )
    return root


def _run(pytester: pytest.Pytester, root: Path, *args: str) -> tuple[pytest.RunResult, Path]:
    junit = root / "junit.xml"
    result = pytester.runpytest_subprocess(
        "--ckpt",
        "r",
        f"--memeval-out={root / 'runs' / 'r'}",
        f"--junitxml={junit}",
        *args,
        timeout=300,
    )
    return result, junit


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["no-xdist", "xdist"])
def test_wrong_answers_take_one_line_each(
    pytester: pytest.Pytester, project: Path, xdist: tuple[str, ...]
) -> None:
    result, junit = _run(pytester, project, *xdist)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    wrong_final = sorted(
        line
        for line in out.splitlines()
        if line.startswith("FAILED test_eval.py::test_final_query")
    )
    expected = sorted(
        f"FAILED test_eval.py::{item_name('test_final_query', sid)} - scenario {sid!r}: "
        f"final query expected {r['messages'][-1]['content']!r}, predicted 'nowhere_at_all'"
        for sid, r in zip(IDS, benchmark_with_ids(IDS), strict=True)
        if sid in WRONG
    )
    assert wrong_final == expected  # one line each, nothing more about them
    assert "wrong answers: " in out
    assert "prompt ends" not in out  # the full report is not printed...
    assert "_ test_final_query[" not in out  # ...nor its FAILURES header
    # ...but the other failure is, in full, and the counts are pytest's own.
    result.stdout.fnmatch_lines(["*_ test_plumbing _*", "*plumbing broke*"])
    result.stdout.re_match_lines([r".* failed, .*"])
    failed_count = int(out.rsplit(" failed", 1)[0].rsplit(" ", 1)[-1].lstrip("="))
    assert failed_count == sum(1 for line in out.splitlines() if line.startswith("FAILED "))
    # JUnit and predictions keep the full record.
    failures = {
        case.attrib["name"]: case.find("failure")
        for case in ElementTree.parse(junit).getroot().iter("testcase")
    }
    for sid in WRONG:
        failure = failures[item_name("test_final_query", sid)]
        assert failure is not None and "prompt ends" in (failure.text or "")
    preds = (project / "runs" / "r" / "predictions.jsonl").read_text("utf-8").splitlines()
    assert {json.loads(p)["id"] for p in preds if not json.loads(p)["final_match"]} == WRONG


@pytest.mark.parametrize("more", [["-v"], ["--tb=short"], ["-rA"], ["--memeval-failures=full"]])
def test_pytest_options_still_give_full_reports(
    pytester: pytest.Pytester, project: Path, more: list[str]
) -> None:
    result, _ = _run(pytester, project, *more)
    out = result.stdout.str()
    assert "wrong answers: " not in out
    assert out.count("prompt ends") >= len(WRONG)
    for sid in WRONG:
        assert f"scenario {sid}: final query expected" in out
    result.stdout.fnmatch_lines(["*FAILURES*", "*_ test_final_query[[]*[]] _*"])


def test_a_bad_mode_is_a_usage_error(pytester: pytest.Pytester, project: Path) -> None:
    result = pytester.runpytest_subprocess("-o", "memeval_failures=terse", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*memeval_failures must be one of*terse*"])


def test_k_matches_the_raw_id_too(pytester: pytest.Pytester, project: Path) -> None:
    # The pytest id of "café 1" is a slug; the raw id is an item keyword, so -k café works.
    result = pytester.runpytest_subprocess("--ckpt", "r", "-k", "café or Straße", "--co", "-q")
    names = {line.split("::", 1)[1] for line in result.stdout.lines if "::" in line}
    assert names == {
        item_name(f, sid)
        for sid in ("café 1", "Straße:3")
        for f in ("test_final_query", "test_turns")
    }
