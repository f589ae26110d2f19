"""README and docs stay inside the repository, and every relative link in them resolves.

A page that names a file outside the checkout (a sibling folder, a path on one machine) is
broken for every reader but its author; a relative link to a moved or renamed page, or to a
heading that changed, is broken for everyone. Links in code (fenced blocks, inline code) are
text, not links, and are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from ..conftest import REPO

PAGES = [
    REPO / "README.md",
    REPO / "demo" / "ASSETS.md",
    *sorted((REPO / "docs").rglob("*.md")),
]

#: Text that points outside the repository: the sibling folder the project was started from,
#: paths of the machines it was written on, file URLs.
OUTSIDE = re.compile(r"\.\./shared|(?<![\w.])/work/|/home/[a-z]|file://")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class Link(NamedTuple):
    page: Path
    target: str


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def links(page: Path) -> list[Link]:
    return [Link(page, m.group(1)) for m in _LINK.finditer(prose(page.read_text("utf-8")))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page (GitHub numbers repeats ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _FENCE.sub("", page.read_text("utf-8")).splitlines():
        heading = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def problem(link: Link) -> str | None:
    """Why ``link`` is broken, or ``None``."""
    where = f"{link.page.relative_to(REPO)}: link {link.target!r}"
    if _SCHEME.match(link.target):
        if link.target.startswith(("https://", "http://")):
            return None
        return f"{where} points outside the repository"
    path_part, _, anchor = link.target.partition("#")
    if path_part.startswith("/"):
        return f"{where} is an absolute path; link relative to the page"
    target = (link.page.parent / path_part).resolve() if path_part else link.page
    if not target.is_relative_to(REPO):
        return f"{where} leaves the repository"
    if not target.exists():
        return f"{where}: {target.relative_to(REPO)} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{where}: no heading #{anchor} in {target.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_names_nothing_outside_the_repository(page: Path) -> None:
    lines = enumerate(page.read_text("utf-8").splitlines(), 1)
    name = page.relative_to(REPO)
    assert [f"{name}:{n}: {line.strip()}" for n, line in lines if OUTSIDE.search(line)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert [p for p in map(problem, links(page)) if p is not None] == []


def test_the_checks_catch_what_they_are_for() -> None:
    """Each kind of broken link is named; code, web links and good anchors pass."""
    page = REPO / "docs" / "reference.md"
    assert problem(Link(page, "../README.md")) is None
    assert problem(Link(page, "statistics.md#slices")) is None
    assert problem(Link(page, "https://pytest.org")) is None
    assert "does not exist" in str(problem(Link(page, "gone.md")))
    assert "no heading #nowhere" in str(problem(Link(page, "statistics.md#nowhere")))
    assert "leaves the repository" in str(problem(Link(page, "../../shared/seed/SEED.en.md")))
    assert "absolute path" in str(problem(Link(page, "/etc/passwd")))
    assert "outside" in str(problem(Link(page, "file:///etc/passwd")))
    assert prose("see `[x](gone.md)` and\n```\n[y](gone.md)\n```\n") == "see  and\n\n"
    assert OUTSIDE.search("([seed](../shared/seed/SEED.en.md))")
    assert OUTSIDE.search("run directory: /work/main/runs/oracle")
    assert not OUTSIDE.search("runs/oracle/ and demo/work/x")
    assert slug("Teacher-forced against free-running: `memeval compare A_B`") == (
        "teacher-forced-against-free-running-memeval-compare-a_b"
    )
