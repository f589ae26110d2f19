"""The Markdown summary (job page, PR comment), rendered with GitHub's own renderer.

Every test reads the Markdown back as GitHub would show it (cmark-gfm, tests/markdown.py):
tables keep their rows and cells, model text comes out as the characters it is, and nothing a
prediction holds becomes a link, an image, a heading or an HTML element.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import compare_runs, load_run
from pytest_memeval.tools.gate import GateCheck, GateOutcome
from pytest_memeval.tools.report import (
    ROWS,
    TEXT_LIMIT,
    MarkdownRun,
    markdown_report,
    md_code,
    md_text,
    run_markdown,
)

from ..markdown import HOSTILE, Rendered, shown
from ..pages import INJECTED, injected_runs
from ..runfactory import SEED_BROKEN, SEED_FIXED, make_record, seed_runs, write_run


def _table_of(texts: tuple[str, ...]) -> str:
    rows = "".join(f"| {md_code(t)} | end |\n" for t in texts)
    return "| text | after |\n| --- | --- |\n" + rows


def test_hostile_text_in_a_table_cell_is_shown_exactly() -> None:
    page = Rendered(_table_of(HOSTILE))
    assert len(page.tables) == 1
    rows = page.tables[0]
    # One row per text, two cells each: no pipe, line break or backtick ended a cell or row.
    assert len(rows) == 1 + len(HOSTILE)
    assert all(len(row) == 2 and row[1] == "end" for row in rows[1:])
    assert [row[0] for row in rows[1:]] == [shown(t) for t in HOSTILE]
    # Nothing became markup: no link, image, script, heading, emphasis or strikethrough.
    assert page.foreign() == []
    assert "strong" not in page.tags and page.tags.count("em") == 1  # "(empty)", ours
    assert page.tags.count("code") == len(HOSTILE) - 1


def test_hostile_text_in_prose_stays_text() -> None:
    for text in HOSTILE:
        page = Rendered(f"- the gate says: {md_text(text)} (end)")
        assert page.foreign() == [], (text, page.html)
        assert "strong" not in page.tags and "em" not in page.tags
        visible = "".join(page.text).strip()
        assert visible == f"the gate says: {shown(text) if text else ''} (end)", page.html


def test_long_model_text_is_cut_and_says_so() -> None:
    text = "x" * (TEXT_LIMIT + 40)
    page = Rendered(_table_of((text,)))
    cell = page.tables[0][1][0]
    assert cell == "x" * TEXT_LIMIT + " …(+40 characters)"


def test_a_run_against_its_baseline_with_the_gate(tmp_path: Path) -> None:
    a, b = seed_runs(tmp_path)  # 167/189 vs 169/189: 4 fixed, 2 broken
    base, cand = load_run(a), load_run(b)
    pair = compare_runs(base, cand)
    gate = GateOutcome(
        checks=[GateCheck("m1", True, "m1 >= 85.00%: 89.42% (169/189), 4.42 pp above")],
        warnings=["--memeval-max-drop 1 pp is smaller than what the baseline can resolve"],
    )
    text = run_markdown(
        MarkdownRun("oracle", b, cand.metrics, cand.records),
        gate=gate,
        exitstatus=0,
        baseline=MarkdownRun("baseline", a, base.metrics, base.records),
        pair=pair,
    )
    page = Rendered(text)
    assert page.foreign() == []
    visible = "".join(page.text)
    assert "memeval: oracle, ✅ gate passed" in visible
    assert "189 scenarios, complete" in visible and "exit status 0" in visible
    metrics, compared, broken, fixed = page.tables
    assert metrics[1] == [
        "m1 final-query",
        "169/189 = 89.42%",
        "[84.22%, 93.04%], Wilson over 189 scenarios",
    ]
    assert metrics[2] == [
        "m2 turn-level (aligned scenarios)",
        "72/72 = 100.00%",
        "[86.20%, 100.00%], Wilson over scenarios (sandwich SE is 0): 72 turns in 24 scenarios",
    ]
    # The paired m1 comparison: the difference, its interval and the exact McNemar test.
    m1 = compared[1]
    assert m1[:4] == ["m1", "167/189 = 88.36%", "169/189 = 89.42%", "+1.06 pp (+2 scenarios)"]
    assert m1[4].endswith("pp (Newcombe)")
    assert m1[5] == "exact McNemar: 4 fixed, 2 broken; p = 0.6875: not significant at 0.05"
    assert compared[2][0].startswith("m2 paired: 24 of 189 scenarios on the same turns")
    assert "can only detect m1 differences of about" in visible  # the MDE
    assert "Divergent: 165/189" in visible
    # The gate: its warning and its check, each with its reason.
    assert "⚠️ WARN --memeval-max-drop 1 pp is smaller" in visible
    assert "✅ PASS m1 >= 85.00%: 89.42% (169/189), 4.42 pp above" in visible
    assert [row[0] for row in broken[1:]] == list(SEED_BROKEN)
    assert [row[0] for row in fixed[1:]] == list(SEED_FIXED)
    assert broken[0] == ["scenario", "truth", "baseline", "this run"]


def test_hostile_predictions_in_the_scenario_tables(tmp_path: Path) -> None:
    a, b = injected_runs(tmp_path)  # B's final answer of s2 is markup; s2 is broken in B
    text = markdown_report([a, b])
    page = Rendered(text)
    assert page.foreign() == []
    broken = next(t for t in page.tables if t[0] == ["scenario", "truth", "baseline", "this run"])
    assert broken[1][0] == "s2"
    cut = len(INJECTED) - TEXT_LIMIT
    assert broken[1][3] == f"{INJECTED[:TEXT_LIMIT]} …(+{cut} characters)"
    # Any prediction, however hostile, keeps each table's row and cell count.
    many = [make_record(f"s{i}", i, final_match=False, final_pred=h) for i, h in enumerate(HOSTILE)]
    run = write_run(tmp_path / "hostile", many, ckpt="hostile|<b>")
    page = Rendered(markdown_report([run]))
    assert page.foreign() == []
    wrong = page.tables[-1]
    assert wrong[0] == ["scenario", "truth", "this run"]
    assert [row[2] for row in wrong[1:]] == [shown(h) for h in HOSTILE]
    assert "memeval: hostile|<b>, complete" in "".join(page.text)


def test_wrong_answers_table_lists_the_first_rows_only(tmp_path: Path) -> None:
    records = [make_record(f"s{i}", i, final_match=i % 3 == 0) for i in range(90)]
    run = write_run(tmp_path / "r", records, ckpt="r")
    page = Rendered(markdown_report([run]))
    wrong = page.tables[-1]
    assert len(wrong) == 1 + ROWS
    assert f"Wrong final answers (60; the first {ROWS})" in "".join(page.text)


def test_an_incomplete_run_says_so(tmp_path: Path) -> None:
    run = load_run(seed_runs(tmp_path)[0])
    metrics = dict(run.metrics, complete=False, missing=["s0001", "s0002"])
    text = run_markdown(MarkdownRun("baseline", run.path, metrics, run.records))
    visible = "".join(Rendered(text).text)
    assert "memeval: baseline, INCOMPLETE" in visible
    assert "INCOMPLETE: 2 selected scenario(s) without a result" in visible
    assert "Missing: 's0001', 's0002'" in visible


@pytest.mark.parametrize("spelling", [["-o", "{out}"], ["--output={out}"]])
def test_memeval_report_writes_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spelling: list[str]
) -> None:
    a, b = seed_runs(tmp_path)
    out = tmp_path / "summary.md"
    args = [s.format(out=out) for s in spelling]
    assert main(["report", str(a), str(b), "--format", "markdown", *args]) == 0
    assert out.read_text("utf-8") == markdown_report([a, b])
    assert capsys.readouterr().out == f"memeval report: wrote {out}\n"
    # Without -o (or with "-"), standard output: `>> $GITHUB_STEP_SUMMARY`, `gh pr comment -F -`.
    assert main(["report", str(a), str(b), "--format", "markdown"]) == 0
    assert capsys.readouterr().out == markdown_report([a, b])
    assert main(["report", str(a), str(b), str(b), "--format", "markdown", "-o", "-"]) == 0
    board = Rendered(capsys.readouterr().out).tables[0]
    assert board[0][:3] == ["#", "run", "m1 final-query"] and len(board) == 4


def test_memeval_report_markdown_refuses_what_compare_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(
        tmp_path / "r", [make_record("s1", 0, final_match=True)], ckpt="r", missing=["s2"]
    )
    assert main(["report", str(run), "--format", "markdown"]) == 2
    assert "incomplete run, refusing" in capsys.readouterr().err
