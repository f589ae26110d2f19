"""The report page in a real browser: headless Chromium (Debian's ``chromium`` package).

``--dump-dom`` prints the DOM after the page's scripts ran: what a reader would see. It shows
that our search script runs (under the page's Content-Security-Policy) while the markup a
prediction carries stays text and never runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main

from ..episodefactory import write_incomplete_episode_run
from ..pages import INJECTED, Page, injected_runs
from ..runfactory import make_record, seed_runs, write_run
from ..waysfactory import FR_MATCHES, loop_run, scenario_run, write_three_ways

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    # A real browser per test: outside the inner loop (-m "not slow").
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="headless Chromium is not installed (apt-get install chromium; .ci/run installs it)",
    ),
]


def _chromium(*args: str, tmp: Path) -> str:
    assert CHROMIUM is not None
    env = dict(os.environ, HOME=str(tmp))  # a throwaway profile; no writes to the real home
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    a, b = injected_runs(tmp)
    out = tmp / "report.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    return out


def test_browser_shows_text_and_runs_no_injected_script(page_file: Path, tmp_path: Path) -> None:
    dom = Page(_chromium("--dump-dom", page_file.as_uri(), tmp=tmp_path))
    titles = [t for t in dom.text if "memeval report" in t]
    assert titles and titles[0] == "memeval report: base vs cand<b>"  # <title> not 'pwned'
    assert not [attrs for tag, attrs in dom.tags if attrs.get("id") == "pwned" or tag == "img"]
    visible = "".join(dom.text)
    assert visible.count(INJECTED) == 2  # shown as the characters the model produced
    # Our script did run: it counted the rows.
    assert "3 of 3 scenarios shown" in visible
    rows = [attrs for tag, attrs in dom.tags if tag == "tr" and "scn" in (attrs.get("class") or "")]
    assert [r["id"] for r in rows] == ["s-s1", "s-s2", "s-s3"]
    assert not any("hidden" in r for r in rows)
    # Both runs 2/3: s3 fixed, s2 broken; McNemar on 1 vs 1 gives p = 1.
    # (each run's m1 shows in the table and in its chart's tooltip)
    assert visible.count("2/3 = 66.67%") == 4 and "+0.00 pp (+0 scenarios)" in visible
    assert "p = 1: not significant at 0.05" in visible


def test_browser_search_filters_rows(page_file: Path, tmp_path: Path) -> None:
    # The page reads a search from its URL fragment, as a typed query would filter.
    dom = Page(_chromium("--dump-dom", page_file.as_uri() + "#q=pwned", tmp=tmp_path))
    rows = {
        attrs["id"]: "hidden" in attrs
        for tag, attrs in dom.tags
        if tag == "tr" and "scn" in (attrs.get("class") or "")
    }
    # Only the scenarios whose text contains "pwned" (the injected predictions) stay visible.
    assert rows == {"s-s1": False, "s-s2": False, "s-s3": True}
    assert "2 of 3 scenarios shown" in "".join(dom.text)


def test_browser_screenshot(page_file: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1280,1600", page_file.as_uri(), tmp=tmp_path)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page, not blank


def test_summary_tables_fit_a_1400_pixel_window(tmp_path: Path) -> None:
    """Runs in deep CI-style directories: the summary table (two runs) and the leaderboard
    (several) stay inside a 1400-pixel window; each path shows its last parts, all on hover.

    The width is measured by the browser: a copy of the page (its policy removed) whose
    script writes the document's scroll width into its title once laid out.
    """
    deep = tmp_path / "home/ci-runner/work/acme-robotics/scene-memory-finetuning/experiments"
    a, b = seed_runs(deep / "2026-12-02/lr-sweep/runs")
    a = a.rename(a.parent / "baseline@checkpoint-12000-lora-r16-alpha32-dropout005-0a1b2c3d4e")
    b = b.rename(b.parent / "oracle@checkpoint-12000-lora-r16-alpha32-dropout005-9f8e7d6c5b")
    for runs, name in (([a, b], "two.html"), ([a, b, a], "many.html")):
        page = tmp_path / name
        assert main(["report", *map(str, runs), "-o", str(page)]) == 0
        html = page.read_text("utf-8")
        assert f"title='{a}'" in html and f"…/runs/{a.name}</small>" in html
        assert _overflow(html, tmp_path / f"measure-{name}") == "overflow=0", name


def _title_once_laid_out(html: str, measure: Path, script: str) -> str:
    """The title ``script`` (JavaScript setting ``document.title``) gives a copy of the page
    (its policy removed) once a 1400-pixel window has laid it out: what the browser measured."""
    measure.write_text(
        re.sub(r"<meta http-equiv='Content-Security-Policy'[^>]*>", "", html).replace(
            "</body>",
            f"<script>window.addEventListener('load', () => {{{script}}});</script></body>",
        ),
        "utf-8",
    )
    dom = _chromium("--window-size=1400,900", "--dump-dom", measure.as_uri(), tmp=measure.parent)
    titles = re.findall(r"<title>([^<]*)", dom)
    return titles[0] if titles else dom[-500:]


def _rows_of(table: str) -> str:
    """JavaScript: ``t`` the table, ``line`` its line height, ``rows`` its body rows' heights."""
    return (
        f"const t = document.querySelector('{table}');"
        "const line = parseFloat(getComputedStyle(t).lineHeight);"
        "const rows = [...t.querySelectorAll('tbody tr')]"
        ".map(r => r.getBoundingClientRect().height);"
    )


def _overflow(html: str, measure: Path, *, boxes: bool = False) -> str:
    """How far the page reaches past a 1400-pixel window, measured by the browser: a copy of
    the page (its policy removed) whose script writes the scroll width into its title.
    ``boxes``: the widest overflow of a scrolling box (``.wide``) counts too."""
    widest = (
        "Math.max(0, ...[...document.querySelectorAll('.wide')].map("
        "e => e.scrollWidth - e.clientWidth))"
        if boxes
        else "0"
    )
    return _title_once_laid_out(
        html,
        measure,
        "document.title = 'overflow=' + Math.max(document.documentElement.scrollWidth - "
        f"document.documentElement.clientWidth, {widest});",
    )


def test_the_episode_page_fits_a_1400_pixel_window(tmp_path: Path) -> None:
    """An episode run's page (long slice tags, an action full of markup) stays inside the
    window, and the action's markup stays text in the browser too."""
    run = tmp_path / "runs" / "smol-twc"
    write_incomplete_episode_run(run)
    page = tmp_path / "episodes.html"
    assert main(["report", str(run), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "class='wide'" in html  # the by-slice table is measured, not only the page
    assert _overflow(html, tmp_path / "measure-episodes.html", boxes=True) == "overflow=0"
    dom = Page(_chromium("--dump-dom", page.as_uri(), tmp=tmp_path))
    assert not [a for tag, a in dom.tags if tag == "img" or a.get("id") == "pwned"]
    assert INJECTED in "".join(dom.text)


def test_the_by_slice_comparison_fits_and_its_rows_stay_a_few_lines(tmp_path: Path) -> None:
    """Two runs with long tags, compared by slice: the eleven-column table stays inside a
    1400-pixel window and within the page's column (it scrolls in its own box if it must),
    and no row is more than five lines of text tall (squeezed, the verdict column ran a word
    a line: rows over ten lines)."""
    tags = ("oracle:close-dropped/query:door-state", "chain:31-40", "query:older-object")
    records: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
    for i in range(60):
        for run, wrong in (("a", i % 3 == 0), ("b", i % 4 == 0)):
            record = make_record(f"s{i:02d}", i, final_match=not wrong)
            record["tags"] = [tags[i % 3], f"room:kitchen-with-a-very-long-name-{i % 2}"]
            records[run].append(record)
    a = write_run(tmp_path / "a", records["a"], ckpt="baseline")
    b = write_run(tmp_path / "b", records["b"], ckpt="oracle")
    page = tmp_path / "two.html"
    assert main(["report", str(a), str(b), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "class='slice-pair'" in html
    title = _title_once_laid_out(
        html,
        tmp_path / "measure.html",
        f"{_rows_of('table.slice-pair')}"
        "document.title = ['overflow=' + (document.documentElement.scrollWidth - "
        "document.documentElement.clientWidth), 'fits=' + (t.getBoundingClientRect().width "
        "<= t.parentElement.parentElement.clientWidth), 'lines=' + "
        "Math.round(Math.max(...rows) / line), 'rows=' + rows.length].join(' ');",
    )
    said = dict(part.split("=") for part in title.split())
    assert said["overflow"] == "0" and said["fits"] == "true", title
    assert int(said["rows"]) >= 5 and int(said["lines"]) <= 5, title


def test_the_three_ways_page_fits_a_1400_pixel_window(tmp_path: Path) -> None:
    """Two models three ways, with slice tags long enough to need wrapping: the page and each
    of its scrolling tables stay inside a 1400-pixel window, and no row of the by-slice table
    is more than four lines of text tall."""
    long = {s: f"room:kitchen_with_a_very_long_name_and_no_break_at_all_{s % 2}" for s in range(5)}
    runs = write_three_ways(tmp_path / "adapter", tags=long)
    runs += [
        scenario_run(tmp_path / "zero-shot" / "tf", FR_MATCHES, "truth", "sha256:z", tags=long),
        loop_run(tmp_path / "zero-shot" / "loop", dict.fromkeys(range(5), False), "sha256:z"),
    ]
    page = tmp_path / "ways.html"
    assert main(["report", *map(str, runs), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "class='ways-slices'" in html
    assert _overflow(html, tmp_path / "measure-ways.html", boxes=True) == "overflow=0"
    title = _title_once_laid_out(
        html,
        tmp_path / "rows.html",
        f"{_rows_of('table.ways-slices')}"
        "document.title = 'lines=' + Math.round(Math.max(...rows) / line);",
    )
    assert int(title.removeprefix("lines=")) <= 4, title
