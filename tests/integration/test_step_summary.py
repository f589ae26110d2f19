"""The run's Markdown summary on the CI job page: ``$GITHUB_STEP_SUMMARY`` and
``--memeval-summary-md``, written by the controller with and without xdist.

Model-free projects (a replay profile scoring crafted predictions) so that which answers are
wrong, and what they say, is known: hostile predictions (pipes, backticks, ``<script>``,
newlines, links, a leading ``#``) as the wrong final answers. The summary is read back as
GitHub renders it (cmark-gfm, tests/markdown.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import MemevalProject, demo_records
from ..markdown import HOSTILE, Rendered, shown
from ..runfactory import make_record, write_crafted, write_run

N = 12


@pytest.fixture
def hostile(memeval_project: MemevalProject) -> tuple[MemevalProject, list[dict[str, Any]]]:
    """12 demo scenarios replayed; the first eight final answers are hostile (and wrong)."""
    recs = demo_records("baseline", N)
    texts = [h for h in HOSTILE if h.strip()][:8]
    write_crafted(
        memeval_project, recs, final_text=dict(zip([r["id"] for r in recs[:8]], texts, strict=True))
    )
    return memeval_project, recs


def _baseline(tmp_path: Path, recs: list[dict[str, Any]]) -> Path:
    """A reference run that got every final answer right, over the same scenarios."""
    return write_run(
        tmp_path / "reference",
        [make_record(r["id"], i, final_match=True) for i, r in enumerate(recs)],
        ckpt="reference",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.slow)], ids=["n0", "n2"]
)
def test_github_step_summary_shows_the_run_the_gate_and_the_baseline(
    hostile: tuple[MemevalProject, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: list[str],
) -> None:
    project, recs = hostile
    summary = tmp_path / "step_summary.md"
    summary.write_text("## an earlier step's summary\n\n", "utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = _baseline(tmp_path, recs)
    result = project.run(
        *workers, "--ckpt", "crafted", "--memeval-min-m1", "0.5", f"--memeval-baseline={base}"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # 4/12: below the gate's 50%
    result.stdout.fnmatch_lines(
        [f"*memeval: Markdown summary appended to $GITHUB_STEP_SUMMARY ({summary})*"]
    )
    text = summary.read_text("utf-8")
    assert text.startswith("## an earlier step's summary\n\n## memeval: `crafted`, ❌ gate failed")
    assert text.count("## memeval:") == 1  # once, by the controller (not by each worker)
    page = Rendered(text)
    assert page.foreign() == []  # no link, image, script or heading from a prediction
    visible = "".join(page.text)
    m = project.metrics("crafted")
    assert f"{N} scenarios, complete" in visible and "exit status 1" in visible
    metrics_table = page.tables[0]
    assert metrics_table[1][:2] == ["m1 final-query", f"4/{N} = 33.33%"]
    low, high = m["m1"]["ci95"]
    assert metrics_table[1][2].startswith(f"[{low * 100:.2f}%, {high * 100:.2f}%]")
    assert "Gate: ❌ FAILED (exit status 1)" in visible
    assert "❌ FAIL m1 >= 50.00%: 33.33% (4/12), 16.67 pp below the threshold" in visible
    assert f"❌ FAIL m1 drop vs baseline <= 0.00 pp: 33.33% vs 100.00% in {base}" in visible
    compared = page.tables[1]
    assert compared[1][:4] == ["m1", "12/12 = 100.00%", "4/12 = 33.33%", "-66.67 pp (-8 scenarios)"]
    assert compared[1][5] == "exact McNemar: 0 fixed, 8 broken; p = 0.007812: significant at 0.05"
    assert "can only detect m1 differences of about" in visible
    broken = page.tables[2]
    assert broken[0] == ["scenario", "truth", "baseline", "this run"]
    # Each hostile prediction is in its own row, shown as the characters the model produced.
    texts = [h for h in HOSTILE if h.strip()][:8]
    assert [row[0] for row in broken[1:]] == [r["id"] for r in recs[:8]]
    assert [row[3] for row in broken[1:]] == [shown(t) for t in texts]
    assert all(len(row) == 4 for row in broken)


@pytest.mark.slow
def test_summary_file_option_ini_and_off(
    hostile: tuple[MemevalProject, list[dict[str, Any]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project, recs = hostile
    github = tmp_path / "github.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(github))
    # The option wins over $GITHUB_STEP_SUMMARY; a relative path is the working directory's;
    # written with a space, as users write options.
    result = project.run("--ckpt", "crafted", "--memeval-summary-md", "out/summary.md")
    written = project.path / "out" / "summary.md"
    assert "## memeval: `crafted`, complete" in written.read_text("utf-8")
    assert not github.exists()
    result.stdout.fnmatch_lines([f"*memeval: Markdown summary appended to {written}*"])
    # A subset is summarised as what it is.
    project.run("--ckpt", "crafted", f"--memeval-summary-md={written}", "-k", recs[0]["id"])
    second = written.read_text("utf-8").split("## memeval:")[2]
    assert "INCOMPLETE" in second and f"a subset: 1 of {N} selected" in second
    # ini "off": nothing, even under GitHub Actions.
    toml = project.path / "pyproject.toml"
    toml.write_text(
        toml.read_text("utf-8").replace(
            "[tool.pytest.ini_options]\n", '[tool.pytest.ini_options]\nmemeval_summary_md = "off"\n'
        ),
        "utf-8",
    )
    result = project.run("--ckpt", "crafted")
    assert not github.exists()
    assert "Markdown summary" not in result.stdout.str()


@pytest.mark.slow
def test_unwritable_summary_is_reported_and_changes_nothing(
    hostile: tuple[MemevalProject, list[dict[str, Any]]], tmp_path: Path
) -> None:
    project, _ = hostile
    blocked = tmp_path / "a-file"
    blocked.write_text("", "utf-8")
    result = project.run(
        "--ckpt", "crafted", "--memeval-min-m1", "0", "--memeval-summary-md", str(blocked / "s.md")
    )
    assert result.ret == pytest.ExitCode.OK  # the gate passed; the summary is not the result
    result.stdout.fnmatch_lines([f"*memeval: could not write the summary to {blocked / 's.md'}*"])
    assert project.metrics("crafted")["complete"] is True
