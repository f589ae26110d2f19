"""One value per figure: the reference docs carry no measurement history, the figures one table.

``docs/decoding.md`` is the fast path's reference (how it works, why it is exact, where it
cannot hold, how to measure it); the dated runs behind its figures are the measurement log in
``docs/measurements/``, and every figure a reader meets elsewhere is a value of the current
table in ``docs/figures.md``. These checks keep it so: the reference stays short and undated,
code comments say why without history, and a speed ratio quoted in README.md or docs/ (outside
the log) is one of the table's values, so that a second value of the same figure cannot creep in.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import NamedTuple

from ..conftest import REPO

DECODING = REPO / "docs" / "decoding.md"
FIGURES = REPO / "docs" / "figures.md"
LOG = REPO / "docs" / "measurements"
PACKAGE = REPO / "pytest_memeval"

#: The reference page is read top to bottom; it was 1,553 lines when the log still lived in it.
MAX_DECODING_LINES = 800

#: A calendar date (an ISO timestamp, ``2026-12-01T15:30:12``, is an example of output, not a date
#: of history), or "since <year>".
DATE = re.compile(
    r"\b20\d\d-[01]\d-[0-3]\d\b(?!T\d)|\bsince 20\d\d(?!\d)(?!-\d\d-\d\dT)", re.IGNORECASE
)
#: Something that reads as a commit hash: 7 to 40 hex digits with at least one digit and one letter.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
#: A measured speed ratio as the docs write it, ``31.8x`` (a whole ``2x`` is arithmetic).
RATIO = re.compile(r"(?<![\w.])\d+\.\d+x\b")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_TABLE_HEAD = "| figure | value |"
_RST_CODE = re.compile(r"``.*?``", re.DOTALL)


class Found(NamedTuple):
    where: str
    text: str


def history_in(text: str, where: str) -> list[Found]:
    """Dates and commit-hash-like words in ``text``, one entry per line that has one."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if DATE.search(line) or COMMIT.search(line):
            found.append(Found(f"{where}:{n}", line.strip()))
    return found


def comments(source: str) -> list[tuple[int, str]]:
    """Every ``#`` comment of a Python source, with its line number."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]


def docstrings(source: str) -> list[tuple[int, str]]:
    """Every module, class and function docstring of a Python source, with its first line
    number, its ````code```` spans left out (an example fingerprint is not a commit)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                line = node.body[0].lineno
                found.append((line, _RST_CODE.sub("", text)))
    return found


def current_values(figures: str) -> set[str]:
    """The speed ratios of the current table's ``value`` column (the table whose header starts
    ``| figure | value |``): the only values a page may quote."""
    lines = figures.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_TABLE_HEAD))
    values: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        values.update(RATIO.findall(cells[1]))
    return values


def table_rows(figures: str) -> list[list[str]]:
    """The current table's rows, as cells."""
    lines = figures.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_TABLE_HEAD))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def stray_ratios(text: str, where: str, values: set[str]) -> list[Found]:
    """Ratios in ``text`` that are not values of the current table."""
    return [Found(where, ratio) for ratio in RATIO.findall(text) if ratio not in values]


def quoting_pages() -> list[Path]:
    """README.md and every page of docs/ but the dated log."""
    docs = sorted((REPO / "docs").rglob("*.md"))
    return [REPO / "README.md", *(page for page in docs if not page.is_relative_to(LOG))]


def test_decoding_is_a_reference_not_a_log() -> None:
    lines = DECODING.read_text("utf-8").splitlines()
    assert len(lines) < MAX_DECODING_LINES, (
        f"docs/decoding.md has {len(lines)} lines: move measurements to docs/measurements/"
    )


def test_decoding_names_no_date_or_commit() -> None:
    text = DECODING.read_text("utf-8")
    assert history_in(text, "docs/decoding.md") == []


def test_package_comments_name_no_date_or_commit() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(REPO))
        source = path.read_text("utf-8")
        for n, comment in [*comments(source), *docstrings(source)]:
            found += history_in(comment, f"{where}:{n}")
    assert found == [], "a comment or docstring says why, without dates or commit hashes"


def test_every_quoted_ratio_is_a_value_of_the_figures_table() -> None:
    values = current_values(FIGURES.read_text("utf-8"))
    assert len(values) >= 8  # the bench rows at least: the table was found and read
    stray = []
    for page in quoting_pages():
        stray += stray_ratios(page.read_text("utf-8"), str(page.relative_to(REPO)), values)
    assert stray == [], "quote the value of docs/figures.md, or change it there"


def test_each_figure_names_its_command_machine_and_date() -> None:
    rows = table_rows(FIGURES.read_text("utf-8"))
    assert rows, "docs/figures.md has no current table"
    # figure | value | command | machine | date | from
    assert [row for row in rows if len(row) != 6 or not all(row)] == []
    assert [row[0] for row in rows if not DATE.search(row[4]) and "FILL IN" not in row[4]] == []


def test_the_log_is_dated_and_linked() -> None:
    campaigns = sorted(p.name for p in LOG.glob("*.md") if p.name != "README.md")
    assert campaigns and all(DATE.match(name) for name in campaigns)
    index = (LOG / "README.md").read_text("utf-8")
    assert [name for name in campaigns if f"({name})" not in index] == []


def test_the_checks_catch_what_they_are_for() -> None:
    """A second value, a date, a commit hash and a dated comment are each found; the
    things that look alike but are not history pass."""
    table = (
        "| figure | value | command | machine | date | from |\n|---|---|---|---|---|---|\n"
        "| demo fp32 | **31.8x** (35.2x) | `memeval bench` | 2-core | 2026-12-02 | log |\n"
        "\nolder: 22.1x\n"
    )
    assert current_values(table) == {"31.8x", "35.2x"}
    assert stray_ratios("fp32 31.8x, or 22.1x, 2x faster, v1.2x", "p", {"31.8x"}) == [
        Found("p", "22.1x")
    ]
    assert history_in("measured 2026-12-01 at cd50dd1", "d") == [
        Found("d:1", "measured 2026-12-01 at cd50dd1")
    ]
    assert history_in("since 2026 the floor", "d") != []
    assert history_in("runs/x since 2026-12-01T15:30:12+00:00; 1e-3; sha256; 0x7f", "d") == []
    assert history_in("deadbeef cafe facade", "d") == []  # hex words without a digit
    source = "x = 1  # measured 2026-12-01\ny = '2026-12-01'  # a string, not a comment\n"
    assert comments(source) == [(1, "# measured 2026-12-01"), (2, "# a string, not a comment")]
    documented = '"""Since cd50dd1 ``run@ckpt-1a2b3c4d``."""\n'
    assert docstrings(documented) == [(1, "Since cd50dd1 .")]
