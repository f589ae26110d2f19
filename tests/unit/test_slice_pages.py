"""The HTML pages by slice: one run's slices, two runs compared slice by slice, several runs
(one family), and pytest-html's summary."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.metrics import Tally
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import load_run
from pytest_memeval.tools.report import render_many, render_report, summary_html

from ..runfactory import make_record, write_run


class _Tables(HTMLParser):
    """The text of each table with a class, by class (cells joined by ' | ')."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._current: str | None = None
        self._in_cell = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        klass = dict(attrs).get("class")
        if tag == "table" and klass:
            self._current = klass
            self.tables.setdefault(klass, [])
        elif tag == "tr" and self._current:
            self.tables[self._current].append([])
        elif tag in ("td", "th") and self._current:
            self.tables[self._current][-1].append("")
            self._in_cell = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._current = None
        elif tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell and self._current:
            self.tables[self._current][-1][-1] += data


def _records(wrong: set[int]) -> list[dict[str, Any]]:
    out = []
    for i in range(40):
        rec = make_record(f"s{i:02d}", i, final_match=i not in wrong)
        rec["tags"] = ["query:door" if i < 20 else "query:where"]
        out.append(rec)
    return out


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    a = write_run(tmp_path / "a", _records(set()), ckpt="a")
    b = write_run(tmp_path / "b", _records(set(range(12))), ckpt="b")  # 12 door answers broken
    c = write_run(tmp_path / "c", _records({25}), ckpt="c")
    return a, b, c


def test_one_run_page_shows_its_slices(runs: tuple[Path, Path, Path]) -> None:
    tables = _Tables(render_report([load_run(runs[1])])).tables
    rows = {row[0]: row for row in tables["slices"][1:]}
    assert rows["query:door"][:3] == ["query:door", "20", "8/20 = 40.00%"]
    assert rows["query:where"][2] == "20/20 = 100.00%"
    assert rows["query:where"][-1].endswith(" pp")  # the m1 MDE of 20 scenarios


def test_two_run_page_compares_by_slice(runs: tuple[Path, Path, Path]) -> None:
    html = render_report([load_run(runs[0]), load_run(runs[1])])
    rows = {row[0]: row for row in _Tables(html).tables["slice-pair"][1:]}
    door = rows["query:door"]
    assert door[1:4] == ["20", "20/20 = 100.00%", "8/20 = 40.00%"]
    assert door[4].startswith("-60.00 pp[-") and door[5] == "0 / 12"
    assert door[-1].startswith("m1 drop of 60.0 pp, adjusted p=")
    assert rows["query:where"][-1].startswith("no detectable difference at n=20")
    assert "adjusted over the 4 tests shown (2 m1, 2 m2)" in html
    # A correction and a slice chosen: the family is what is shown.
    only = render_report([load_run(runs[0]), load_run(runs[1])], slices=["query:door"], method="bh")
    assert "adjusted over the 2 tests shown (1 m1, 1 m2): Benjamini-Hochberg" in only
    assert [r[0] for r in _Tables(only).tables["slice-pair"][1:]] == ["query:door"]


def test_many_run_page_adjusts_over_every_run_and_slice(runs: tuple[Path, Path, Path]) -> None:
    a, b, c = (load_run(p) for p in runs)
    html = render_many(a, [b, c])
    assert "adjusted over the 8 tests shown (4 m1, 4 m2)" in html
    assert html.count("class='slice-pair'") == 2
    assert "<b>b</b> against a, by slice" in html and "<b>c</b> against a, by slice" in html


def test_report_command_takes_slices_and_correction(
    runs: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    args = ["report", str(runs[0]), str(runs[1]), "-o", str(out), "--correction", "bh"]
    assert main([*args, "--slice", "query:where"]) == 0
    assert "Benjamini-Hochberg" in out.read_text("utf-8")
    assert main([*args, "--slice", "nope"]) == 2
    assert "memeval report: refused: slice 'nope': no scenario carries" in capsys.readouterr().err


def test_pytest_html_summary_always_shows_the_slices() -> None:
    metrics: Any = {"ckpt": "x", "complete": True, **Tally().extend(_records({1})).counts()}
    rows = {row[0]: row for row in _Tables(summary_html(metrics, None)).tables["slices"][1:]}
    assert rows["query:door"][2] == "19/20 = 95.00%"
    untagged: Any = {"ckpt": "x", "complete": True, **Tally().counts()}
    assert "slices" not in summary_html(untagged, None)
