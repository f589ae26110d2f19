"""``memeval report``: the self-contained page, parsed; and the pytest-html renderers."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main
from pytest_memeval.tools.report import scenario_detail_html, summary_html

from ..pages import INJECTED, Page, injected_runs
from ..runfactory import SEED_BROKEN, SEED_FIXED, make_record, seed_runs, write_run


def test_model_text_stays_text(tmp_path: Path) -> None:
    a, b = injected_runs(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    text = out.read_text("utf-8")
    page = Page(text)
    # Exactly one script element, ours; no element from the prediction exists.
    assert len([t for t in page.tags if t[0] == "script"]) == 1
    assert not [t for t in page.tags if t[0] == "img" or t[1].get("id") == "pwned"]
    assert not any("onerror" in attrs for _, attrs in page.tags)
    # The prediction is visible as the characters it is (twice: final of s2, turn 0 of s1).
    assert "".join(page.text).count(INJECTED) == 2
    assert "cand<b>" in "".join(page.text) and "<b>cand" not in text
    # The CSP admits our script by its hash, and nothing else.
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv"))
    assert csp is not None and "default-src 'none'" in csp
    digest = base64.b64encode(hashlib.sha256(page.scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp


def test_page_is_self_contained_and_complete(tmp_path: Path) -> None:
    a, b = seed_runs(tmp_path)
    out = tmp_path / "seed.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    text = out.read_text("utf-8")
    page = Page(text)
    # Nothing to fetch: no src attributes, no external links, no url(...) in styles.
    assert not [attrs for _, attrs in page.tags if "src" in attrs]
    assert all(attrs["href"].startswith("#") for tag, attrs in page.tags if "href" in attrs)
    assert "url(" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    visible = " ".join(page.text)
    for expected in (
        "167/189 = 88.36%",
        "169/189 = 89.42%",
        "+1.06 pp",
        "165/189",
        "[83.01%, 92.19%]",
        "p = 0.6875: not significant at 0.05",
    ):
        assert expected in visible
    # Flips link to their rows; every scenario has a row.
    for sid in SEED_FIXED + SEED_BROKEN:
        assert f"href='#s-{sid}'" in text and f"id='s-{sid}'" in text
    rows = [
        attrs for tag, attrs in page.tags if tag == "tr" and "scn" in (attrs.get("class") or "")
    ]
    assert len(rows) == 189
    assert sum("divergent" in (r.get("class") or "") for r in rows) == 165
    assert sum("fixed" in (r.get("class") or "").split() for r in rows) == 4
    # Charts: m1 and m2 interval charts and the per-position m2 lines, inline SVG.
    svgs = [attrs for tag, attrs in page.tags if tag == "svg"]
    assert [s.get("class") for s in svgs] == ["ci-chart", "ci-chart", "position-chart"]
    lines = [attrs["data-run"] for tag, attrs in page.tags if tag == "polyline"]
    assert lines == ["baseline", "oracle"]
    # The oracle's 24 aligned scenarios give its m2 per position (3 positions of 24).
    assert "oracle, turn 2: 24/24 = 100.00%" in visible


def test_single_run_report(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "one",
        [make_record("s1", 0, final_match=True), make_record("s2", 1, final_match=False)],
        ckpt="solo",
    )
    out = tmp_path / "one.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = Page(out.read_text("utf-8"))
    visible = " ".join(page.text)
    assert "1/2 = 50.00%" in visible and "memeval report: solo" in visible
    assert "Flipped" not in visible and "divergent" not in visible


def test_refusal_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(
        tmp_path / "a", [make_record("s1", 0, final_match=True)], ckpt="a", missing=["s2"]
    )
    out = tmp_path / "r.html"
    assert main(["report", str(a), "-o", str(out)]) == 2
    assert "incomplete run" in capsys.readouterr().err
    assert not out.exists()


def test_pytest_html_pieces_escape_model_text() -> None:
    rec = make_record(
        "s9",
        0,
        final_match=False,
        final_pred=INJECTED,
        turn_preds=[INJECTED, "place mug in sink"],
        turn_matches=[False, True],
    )
    rec["prompt_tail"] = "<|user|>where is <the mug>?<|assistant|>"
    detail = scenario_detail_html(rec)
    page = Page(detail)
    assert not [t for t in page.tags if t[0] in ("script", "img")]
    assert "".join(page.text).count(INJECTED) == 2
    assert "where is <the mug>?" in "".join(page.text)
    assert re.search(r"<th>target</th><th>truth</th><th>prediction</th>", detail)
    summary = summary_html(
        {
            "ckpt": "x<y",
            "n": 4,
            "complete": True,
            "unaligned": 1,
            "m1": {"correct": 3, "total": 4},
            "m2": {"correct": 0, "total": 0},
            "parse_fail": {"final": 0, "turns": 2},
        },
        None,
    )
    assert "memeval: x&lt;y" in summary and "3/4 = 75.00%" in summary and "0/0 = n/a" in summary
    assert "[30.06%, 95.44%]" in summary  # Wilson 3/4
