"""The HTML pages' Jinja2 templates: strict, autoescaped, and the static files inlined.

Every page and piece (``memeval report`` for one run, two and several; pytest-html's summary
and per-scenario extra) is rendered from hostile data: a ``<script>`` with quotes and an
ampersand in every scenario id, prediction, truth, turn, prompt, run label, run path, parse
failure reason and gate line. Each section of each page must show it as text (the parser
reads back exactly the characters), and the page must hold no element it did not write.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jinja2
import pytest

from pytest_memeval.tools import report
from pytest_memeval.tools.compare import load_run
from pytest_memeval.tools.gate import GateCheck, GateOutcome
from pytest_memeval.tools.report import (
    environment,
    render,
    render_many,
    render_report,
    scenario_detail_html,
    static_text,
    summary_html,
)

from ..runfactory import make_record, write_run

#: markup with both quotes and an ampersand: it breaks out of text, of either attribute quoting
#: and of an entity if any of them is printed unescaped
EVIL = "<script>alert('memeval')</script>\"&amp;"
#: the same for a directory name (no "/")
EVIL_DIR = "run<script>'\"&amp;"

#: the report package: its modules, templates/ and static/
REPORT = Path(report.__file__ or "").parent
TEMPLATES = REPORT / "templates"
PAGES = (
    "one_or_two.html",
    "many.html",
    "scenario_detail.html",
    "summary.html",
    "episodes.html",
    "ways.html",
)
VOID = {"meta", "br", "input", "img", "link", "hr"}


class Page(HTMLParser):
    """Elements, and each text with the elements around it, as a browser's parser sees them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[tuple[str, tuple[tuple[str, dict[str, str | None]], ...]]] = []
        self._open: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self._open.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        names = [name for name, _ in self._open]
        if tag in names:
            del self._open[len(names) - 1 - names[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        self.texts.append((data, tuple(self._open)))

    def text_in(self, tag: str, within: str | None = None, **attrs: str) -> str:
        """All text inside elements ``tag`` (inside a ``within``) whose attributes contain
        ``attrs`` (``class_``: one of its words)."""

        def matches(name: str, have: dict[str, str | None]) -> bool:
            if name != tag:
                return False
            for key, value in attrs.items():
                key = key.rstrip("_")
                got = have.get(key) or ""
                if (value not in got.split()) if key == "class" else (got != value):
                    return False
            return True

        return "".join(
            d
            for d, around in self.texts
            if any(matches(*el) for el in around)
            and (within is None or any(n == within for n, _ in around))
        )

    def attr_values(self, tag: str, attr: str) -> list[str | None]:
        return [attrs.get(attr) for name, attrs in self.tags if name == tag and attr in attrs]

    def count(self, tag: str) -> int:
        return sum(name == tag for name, _ in self.tags)


def _hostile_record(sid: str, index: int, **kw: Any) -> dict[str, Any]:
    rec = make_record(
        sid,
        index,
        targets=[f"pick {EVIL} from counter", "place mug in sink"],
        turn_preds=[EVIL, "place mug in sink"],
        turn_matches=[False, True],
        final_gt=f"sink{EVIL}",
        **kw,
    )
    return rec


@pytest.fixture
def hostile_runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Three runs in directories with markup in their names; ids, labels, texts hostile."""
    sids = [f"s{i}{EVIL}" for i in range(4)]
    a = write_run(
        tmp_path / f"{EVIL_DIR}a",
        [
            _hostile_record(s, i, final_match=i % 2 == 0, final_pred=EVIL)
            for i, s in enumerate(sids)
        ],
        ckpt=f"a{EVIL}",
    )
    b = write_run(
        tmp_path / f"{EVIL_DIR}b",
        [_hostile_record(s, i, final_match=i != 0, final_pred=EVIL) for i, s in enumerate(sids)],
        ckpt=f"b{EVIL}",
    )
    c = write_run(
        tmp_path / f"{EVIL_DIR}c",
        [_hostile_record(s, i, final_match=True) for i, s in enumerate(sids)],
        ckpt=f"c{EVIL}",
    )
    return a, b, c


def _row_ids(page: Page) -> list[str]:
    return [a["id"] or "" for t, a in page.tags if t == "tr" and "scn" in (a.get("class") or "")]


def _no_foreign_markup(html: str, scripts: int) -> Page:
    """The page holds only the elements it wrote: EVIL never appears unescaped."""
    assert EVIL not in html and "<script>alert" not in html
    page = Page(html)
    assert page.count("script") == scripts
    return page


def test_two_run_page_escapes_every_section(hostile_runs: tuple[Path, Path, Path]) -> None:
    a, b, _ = hostile_runs
    html = render_report([load_run(a), load_run(b)])
    page = _no_foreign_markup(html, scripts=1)
    label_a, label_b = f"a{EVIL}", f"b{EVIL}"
    assert page.text_in("title", within="head") == f"memeval report: {label_a} vs {label_b}"
    assert page.text_in("h1") == f"memeval report: {label_a} vs {label_b}"
    summary = page.text_in("table", id="compare")
    assert label_a in summary and label_b in summary
    # Each run's path: its last two parts as text (the table fits a window), all on hover.
    assert f"…/{a.parent.name}/{a.name}" in summary and f"…/{b.parent.name}/{b.name}" in summary
    assert page.attr_values("small", "title") == [str(a), str(b)]
    # Charts: the full label in each whisker's tooltip and each line's data-run attribute.
    charts = page.text_in("svg", class_="ci-chart")
    assert charts.count(f"{label_a}: ") == 2 and charts.count(f"{label_b}: ") == 2
    assert page.attr_values("polyline", "data-run") == [label_a, label_b]
    legend = page.text_in("div", class_="chart")
    assert "…" in legend  # the long labels are cut from the left, still as text
    # Flips: A is right at s0 and s2, B wrong only at s0: s1, s3 fixed; s0 broken.
    assert page.text_in("div", id="fixed").count(EVIL) == 2
    assert page.text_in("div", id="broken").count(EVIL) == 1
    hrefs = page.attr_values("a", "href")
    assert len(hrefs) == 3 and all(h in [f"#{r}" for r in _row_ids(page)] for h in hrefs)
    table = page.text_in("table", id="scenarios")
    for i in range(4):
        assert f"s{i}{EVIL}" in table
    assert table.count(f"sink{EVIL}") == 4  # the truth column
    assert page.text_in("td", class_="final").count(EVIL) == 8  # both runs' predictions
    assert page.text_in("td", class_="t").count(f"pick {EVIL} from counter") == 8
    assert page.text_in("code").count(EVIL) == 4  # each prompt's end (it names the id)
    # The rows' anchors are pytest ids: no markup, no quote, no space.
    assert len(_row_ids(page)) == 4
    assert all(re.fullmatch(r"s-[A-Za-z0-9_.+\-]+", r) for r in _row_ids(page))


def test_one_run_and_many_run_pages_escape_every_section(
    hostile_runs: tuple[Path, Path, Path],
) -> None:
    a, b, c = hostile_runs
    one = _no_foreign_markup(render_report([load_run(c)]), scripts=1)
    assert one.text_in("title", within="head") == f"memeval report: c{EVIL}"
    assert one.text_in("td", class_="final").count(f"sink{EVIL}") == 4  # c predicts the truth
    assert one.text_in("td", class_="truth").count(f"sink{EVIL}") == 4

    many = _no_foreign_markup(render_many(load_run(a), [load_run(b), load_run(c)]), scripts=0)
    board = many.text_in("table", id="leaderboard")
    for run in (a, b, c):
        assert f"…/{run.parent.name}/{run.name}" in board
    assert sorted(v or "" for v in many.attr_values("small", "title")) == [str(a), str(b), str(c)]
    for label in (f"a{EVIL}", f"b{EVIL}", f"c{EVIL}"):
        assert label in board
    assert many.attr_values("g", "data-run") == [f"c{EVIL}", f"b{EVIL}"]  # by m1, best first
    forest = many.text_in("svg", class_="forest-plot")
    assert forest.count(f"b{EVIL}: ") == 1 and forest.count(f"c{EVIL}: ") == 1
    pairs = many.text_in("details", class_="pair")
    assert pairs.count(f"b{EVIL}") == 1 and pairs.count(f"c{EVIL}") == 1
    flipped = many.text_in("div", class_="fixed") + many.text_in("div", class_="broken")
    # Against A (right at s0, s2): b fixes s1, s3 and breaks s0; c fixes s1, s3.
    assert flipped.count(EVIL) == 3 + 2
    assert many.attr_values("a", "href") == []  # no rows on this page: no dead links


def test_pytest_html_pieces_escape_every_section() -> None:
    rec = _hostile_record(f"s{EVIL}", 0, final_match=False, final_pred=EVIL, parse_fail=True)
    rec["parse_fail_reason"] = EVIL
    detail = _no_foreign_markup(scenario_detail_html(rec), scripts=0)
    assert detail.text_in("b").count(f"scenario s{EVIL}") == 1
    assert detail.text_in("code") == EVIL + f"sink{EVIL}"
    assert detail.text_in("p").count(f"({EVIL})") == 1  # the parse failure's reason
    assert detail.text_in("pre").count(EVIL) == 1  # the prompt's end names the id
    turns = detail.text_in("table", class_="turns")
    assert turns.count(f"pick {EVIL} from counter") == 2 and turns.count(EVIL) == 3
    # A wrong turn opens the turn table.
    assert [attrs for name, attrs in detail.tags if name == "details"] == [{"open": None}]

    metrics = {
        "ckpt": f"c{EVIL}",
        "n": 1,
        "complete": True,
        "unaligned": 0,
        "m1": {"correct": 0, "total": 1},
        "m2": {"correct": 1, "total": 2},
        "parse_fail": {"final": 1, "turns": 0},
    }
    gate = GateOutcome(checks=[GateCheck("m1", False, f"m1 {EVIL}")], warnings=[f"w {EVIL}"])
    summary = _no_foreign_markup(summary_html(metrics, gate), scripts=0)
    assert summary.text_in("h2") == f"memeval: c{EVIL}"
    assert summary.text_in("li") == f"WARN: w {EVIL}FAIL: m1 {EVIL}"
    assert "gate FAILED" in summary.text_in("p")
    empty = _no_foreign_markup(summary_html(None, None), scripts=0)
    assert empty.text_in("p") == "no run was written"


def test_every_template_is_strict_and_autoescaped() -> None:
    env = environment()
    assert sorted(env.list_templates()) == sorted(
        ["_charts.html", "_macros.html", "_page.html", *PAGES]
    )
    assert env.undefined is jinja2.StrictUndefined
    # Autoescape for .html files, for any other name and for templates from strings.
    assert callable(env.autoescape)
    assert all(env.autoescape(name) for name in ("x.html", "x.txt", None))
    assert env.from_string("{{ v }}").render(v=EVIL) == (
        "&lt;script&gt;alert(&#39;memeval&#39;)&lt;/script&gt;&#34;&amp;amp;"
    )
    # A page rendered without its data fails loudly instead of printing blanks.
    for name in PAGES:
        with pytest.raises(jinja2.UndefinedError):
            render(name)


def test_only_our_static_files_are_marked_safe() -> None:
    """``|safe`` appears only on ``static("...")``: a package file, never data."""
    for path in TEMPLATES.glob("*.html"):
        source = re.sub(r"{#.*?#}", "", path.read_text("utf-8"), flags=re.S)  # no comments
        assert not re.search(r"{%-?\s*autoescape", source), path.name  # no autoescape block
        for match in re.finditer(r"\|\s*safe\b", source):
            before = source[: match.start()]
            assert re.search(r'static\("[a-z]+\.(css|js)"\)\s*$', before), (path.name, before[-60:])
    # No escaping by hand left in the Python that feeds the templates.
    for module in sorted(REPORT.glob("*.py")):
        text = module.read_text("utf-8").replace("autoescape", "")
        assert "escape(" not in text and "from html import" not in text, module.name


def test_static_files_are_inlined(hostile_runs: tuple[Path, Path, Path]) -> None:
    css, js = static_text("report.css"), static_text("report.js")
    # Neither can end its element early (or open a comment) once inlined.
    assert "</style" not in css.lower() and "<!--" not in css
    assert "</script" not in js.lower() and "<!--" not in js
    a, b, c = hostile_runs
    two = render_report([load_run(a), load_run(b)])
    many = render_many(load_run(a), [load_run(b), load_run(c)])
    for html, script in ((two, js), (many, None)):
        page = Page(html)
        assert page.text_in("style") == css
        assert page.text_in("script") == (script or "")
        # Nothing to fetch: no src, no stylesheet link, no off-page href.
        assert not [attrs for _, attrs in page.tags if "src" in attrs]
        assert page.count("link") == 0
        assert all((h or "").startswith("#") for h in page.attr_values("a", "href"))
        csp = page.attr_values("meta", "content")[0] or ""
        assert csp.startswith("default-src 'none'; style-src 'unsafe-inline'; img-src data:")
        if script is None:
            assert "script-src" not in csp
        else:
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            assert csp.endswith(f"; script-src 'sha256-{digest}'")


def test_jinja2_is_imported_only_when_a_page_is_rendered() -> None:
    """No module of the HTML path imports jinja2 at its top level (outside TYPE_CHECKING)."""
    for module in sorted(REPORT.glob("*.py")):
        tree = ast.parse(module.read_text("utf-8"))
        top = []
        for node in tree.body:
            if isinstance(node, ast.Import):
                top += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                top.append(node.module or "")
        assert not [name for name in top if name.split(".")[0] in ("jinja2", "markupsafe")]
    # ...and templating does, inside the function that builds the environment.
    source = (REPORT / "templating.py").read_text("utf-8")
    assert re.search(r"def environment\(\).*?\n    import jinja2\n", source, re.S)
