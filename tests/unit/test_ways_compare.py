"""One model three ways (tools/compare/ways.py): teacher-forced, free-running and closed-loop
runs of the same seeds set side by side, paired by id, on run directories written as the
plugin writes them (scenario runs counted by the plugin's ``Tally``, episode runs by
``finalize_episode_run`` from real episodes). The expected numbers are stated here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.stats import wilson_interval
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import CompareError, compare_ways, format_ways, load_ways

from ..markdown import Rendered
from ..waysfactory import (
    FR_MATCHES,
    OPENED,
    PUT,
    SUCCESS,
    TAGS,
    TF_MATCHES,
    loop_run,
    scenario_run,
    write_three_ways,
)


@pytest.fixture
def three_ways(tmp_path: Path) -> list[Path]:
    """Seeds 0-2 every turn right teacher-forced, 0 and 1 reproduced free-running; 0 and 4
    succeed in the environment (tests/waysfactory.py)."""
    return write_three_ways(tmp_path)


def test_one_model_three_ways_paired_by_seed(three_ways: list[Path]) -> None:
    result = compare_ways(load_ways(three_ways))
    assert result["kind"] == "ways" and result["seeds"] == 5
    (model,) = result["models"]
    assert model["label"] == "loop"
    # m2: 15 turns teacher-forced, 13 right; free-running 6 + 2 = 8 right
    assert (model["m2_teacher_forced"]["correct"], model["m2_teacher_forced"]["total"]) == (13, 15)
    assert model["m2_free_running"] is not None
    assert (model["m2_free_running"]["correct"], model["m2_free_running"]["total"]) == (8, 15)
    assert (model["m1"]["correct"], model["m1"]["total"]) == (3, 5)
    success = model["success"]
    assert (success["correct"], success["total"]) == (2, 5)
    assert success["ci95"] == pytest.approx(list(wilson_interval(2, 5)))
    carry = model["carryover"]
    # every turn right: 0, 1, 2 (0 succeeded, 1 and 2 failed); a wrong turn: 3 (failed), 4 (won)
    assert (carry["both"], carry["turns_only"], carry["success_only"], carry["neither"]) == (
        1,
        2,
        1,
        1,
    )
    assert carry["turns_only_ids"] == ["twc-1", "twc-2"] and carry["success_only_ids"] == ["twc-4"]
    assert carry["agreement"] == pytest.approx(2 / 5)
    assert carry["turn_accuracy_of_successes"] == pytest.approx((1 + 2 / 3) / 2)
    assert carry["turn_accuracy_of_failures"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    # free-running, 0 and 1 reproduced the gold path; 1 failed in the environment: said by id
    assert model["free_running_reproduced"] == {"seeds": 2, "succeeded": 1, "failed_ids": ["twc-1"]}


def test_slices_are_the_tags_that_split_the_seeds(three_ways: list[Path]) -> None:
    result = compare_ways(load_ways(three_ways))
    assert [(s["tag"], s["n"]) for s in result["slices"]] == [
        ("query:close-opened", 2),
        ("query:where-put", 3),
    ]  # rooms:1 is on every seed: the whole table again
    opened = result["slices"][0]["models"][0]
    assert (opened["success"]["correct"], opened["success"]["total"]) == (1, 2)
    assert (opened["m2_teacher_forced"]["correct"], opened["m2_teacher_forced"]["total"]) == (4, 6)
    assert (opened["m1"]["correct"], opened["m1"]["total"]) == (1, 2)
    assert opened["carryover"]["success_only_ids"] == ["twc-4"]
    chosen = compare_ways(load_ways(three_ways), ["query:where*"])
    assert [s["tag"] for s in chosen["slices"]] == ["query:where-put"]


def test_slices_are_named_as_every_comparison_names_them(
    three_ways: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--slice`` reads a tag, a glob or ``TAG&TAG`` as the other comparisons do; an
    expression that names no slice of the seeds is refused (it was an empty table)."""
    groups = load_ways(three_ways)
    both = compare_ways(groups, ["query:where-put&rooms:1"])["slices"]
    assert [(s["tag"], s["n"]) for s in both] == [("query:where-put&rooms:1", 3)]
    alone = compare_ways(groups, ["query:where-put"])["slices"][0]
    assert both[0]["models"] == alone["models"]  # rooms:1 is on every seed
    with pytest.raises(CompareError, match=r"no scenario carries the tag 'nosuch'"):
        compare_ways(groups, ["nosuch"])
    with pytest.raises(CompareError, match=r"matches no tag"):
        compare_ways(groups, ["door:*"])
    with pytest.raises(CompareError, match=r"no seed carries all of its tags"):
        compare_ways(groups, ["query:where-put&query:close-opened"])
    assert main(["compare", *map(str, three_ways), "--slice", "nosuch"]) == 2
    assert "no scenario carries the tag 'nosuch'" in capsys.readouterr().err


def test_models_in_the_order_given_and_the_text(tmp_path: Path, three_ways: list[Path]) -> None:
    other_tf = scenario_run(tmp_path / "tf2", FR_MATCHES, "truth", model="sha256:m2")
    other_loop = loop_run(tmp_path / "loop2", dict.fromkeys(range(5), True), model="sha256:m2")
    result = compare_ways(load_ways([other_loop, *three_ways, other_tf]))
    assert [m["label"] for m in result["models"]] == ["loop2", "loop"]
    assert result["models"][0]["m2_free_running"] is None
    text = format_ways(result)
    assert "13/15 = 86.67%" in text and "2/5 = 40.00%" in text and "5/5 = 100.00%" in text
    assert "1 did not ('twc-1')" in text and "2 failed ('twc-1', 'twc-2')" in text


def test_runs_that_do_not_make_three_ways_are_refused(
    tmp_path: Path, three_ways: list[Path]
) -> None:
    tf, fr, loop = three_ways
    with pytest.raises(CompareError, match=r"are 1 teacher-forced, 1 free-running, 0 closed-loop"):
        load_ways([tf, fr, loop_run(tmp_path / "other", SUCCESS, model="sha256:x")])
    with pytest.raises(CompareError, match=r"are 1 teacher-forced, 0 free-running, 2 closed-loop"):
        load_ways([tf, loop, loop_run(tmp_path / "again", SUCCESS)])
    fewer = scenario_run(tmp_path / "fewer", {s: TF_MATCHES[s] for s in range(4)}, "truth")
    with pytest.raises(CompareError, match=r"different seeds: 1 only in .*loop: 'twc-4'"):
        load_ways([fewer, loop])


def test_the_command_prints_the_three_ways(
    three_ways: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", *map(str, three_ways), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "ways" and data["models"][0]["carryover"]["both"] == 1
    assert main(["compare", *map(str, three_ways)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("One model, three ways, on the same 5 seeds")
    assert "By slice" in out and "query:close-opened" in out


def test_the_page_shows_the_three_ways_and_escapes_text(
    tmp_path: Path, three_ways: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "ways.html"
    assert main(["report", *map(str, three_ways), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "<title>memeval: loop, three ways</title>" in html
    assert "13/15 = 86.67%" in html and "2/5 = 40.00%" in html
    assert "twc-1, twc-2" in html  # every turn right, yet failed
    assert "left it at turn 0" in html and "gold path reproduced" in html
    assert "<script" not in html  # no script on this page


def test_the_markdown_form_as_github_shows_it_with_hostile_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memeval report --format markdown`` of the three ways (a job summary, a pull-request
    comment), rendered by GitHub's own renderer: the rates, the carry-over in words, the slices
    asked for, the seeds where the turns and the environment disagree; a run label and a tag
    that try to be markup are shown as their characters."""
    # what a tag may hold (core/tags.py) that Markdown reads: a mail autolink, emphasis
    hostile = "query:_x_@evil.example"
    tf, fr, _ = write_three_ways(tmp_path, {**TAGS, 0: hostile, 1: hostile})
    label = "lo|op <img src=x onerror=alert(1)> _em_ `t` [a](javascript:b)"
    loop = loop_run(tmp_path / label, SUCCESS)
    out_file = tmp_path / "ways.md"
    args = ["report", str(tf), str(fr), str(loop), "--format", "markdown", "--slice", "query:*"]
    assert main([*args, "-o", str(out_file)]) == 0
    assert capsys.readouterr().out == f"memeval report: wrote {out_file}\n"
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text == out_file.read_text("utf-8")
    page = Rendered(text)
    assert page.foreign() == [] and "strong" not in page.tags and "em" not in page.tags
    rates, slices, disagree = page.tables
    assert rates[0] == ["model", "m2 teacher-forced", "m2 free-running", "m1 final question",
                        "success"]  # fmt: skip
    assert rates[1][0] == label and rates[1][1].startswith("13/15 = 86.67% [")
    assert rates[1][4].startswith("2/5 = 40.00% [")
    assert sorted(row[0] for row in slices[1:]) == sorted([hostile, PUT, OPENED])
    assert next(row for row in slices if row[0] == hostile)[1:3] == ["2", label]
    # every turn right yet failed: twc-1, twc-2; a wrong turn yet succeeded: twc-4
    assert [row[0] for row in disagree[1:]] == ["twc-1", "twc-2", "twc-4"]
    assert disagree[1][1:] == [label, "3/3", "gold path reproduced", "right", "step_limit after 2"]
    visible = "".join(page.text)
    assert "every turn right teacher-forced on 3 of 5 seeds, 1 of them succeeded" in visible
    assert "failed: twc-1, twc-2" in visible and "yet succeeded: twc-4" in visible
    assert "Seeds where the turns and the environment disagree: 3" in visible


def test_two_models_are_tested_way_by_way_paired_by_seed(
    tmp_path: Path, three_ways: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A second model against the first: B - A on each way both models have, with the pair
    tests' p-values Holm-adjusted over the ways; in the JSON, the text, the page and the
    Markdown alike."""
    other_tf = scenario_run(tmp_path / "tf2", FR_MATCHES, "truth", model="sha256:m2")
    other_loop = loop_run(tmp_path / "loop2", dict.fromkeys(range(5), True), model="sha256:m2")
    paths = [*map(str, three_ways), str(other_tf), str(other_loop)]
    assert compare_ways(load_ways(three_ways))["differences"] == []  # one model: nothing
    assert main(["compare", *paths, "--json"]) == 0
    (pair,) = json.loads(capsys.readouterr().out)["differences"]
    assert (pair["a"], pair["b"], pair["seeds"]) == ("loop", "loop2", 5)
    ways = {w["way"]: w for w in pair["ways"]}
    assert list(ways) == ["m2 teacher-forced", "m1", "success"]  # no free-running run of B
    # success: seeds 1, 2 and 3 fixed, none broken: +60 pp, exact McNemar p = 2 * 0.5**3
    assert ways["success"]["delta_pp"] == pytest.approx(60.0)
    assert ways["success"]["p_value"] == pytest.approx(0.25)
    # m1: 3/5 each, no seed changed
    assert ways["m1"]["delta_pp"] == 0 and ways["m1"]["p_value"] == 1
    # m2: 13/15 against 8/15 over the same turns, paired by scenario
    assert ways["m2 teacher-forced"]["delta_pp"] == pytest.approx(-100 / 3)
    assert ways["m2 teacher-forced"]["p_value"] == pytest.approx(0.25)
    # Holm over three p-values 0.25, 1, 0.25: 3 x 0.25, then max(2 x 0.25, 0.75), then 1
    assert [w["p_holm"] for w in pair["ways"]] == pytest.approx([0.75, 1.0, 0.75])
    assert not any(w["significant_holm"] for w in pair["ways"])
    assert main(["compare", *paths]) == 0
    text = capsys.readouterr().out
    assert "Paired against loop (A), seed by seed" in text
    assert "loop2  success            +60.00 pp  [+2.98, +88.24] pp   0.25  0.75" in text
    page = tmp_path / "ways.html"
    assert main(["report", *paths, "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "<h2>paired against loop</h2>" in html
    assert "<td>loop2</td><td>success</td><td class='num'>+60.00 pp</td>" in html
    capsys.readouterr()
    assert main(["report", *paths, "--format", "markdown"]) == 0
    header = ["model", "way", "B - A", "95% interval", "p", "p (Holm)"]
    (rows,) = [t for t in Rendered(capsys.readouterr().out).tables if t[0] == header]
    assert rows[3][:3] == ["loop2", "success", "+60.00 pp"]
