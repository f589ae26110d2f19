"""Reading the Markdown the plugin writes as GitHub shows it, and predictions that try to
break it.

GitHub renders job summaries and comments with cmark-gfm (GitHub Flavored Markdown: tables,
autolinks, strikethrough, raw HTML it then sanitises); ``cmarkgfm`` is that library. Rendered
here with raw HTML let through (``UNSAFE``), so that a prediction that became markup shows up
as an element instead of being dropped: the tests then check which elements exist.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options

#: Predictions that would break a Markdown table or become markup if printed as they are.
HOSTILE = (
    "a | b || c",
    "`tick` and ``two`` ticks`",
    "<script>alert('md')</script>",
    "first line\nsecond line\r\nthird",
    "[click](javascript:alert(1))",
    "# not a heading",
    "https://evil.example/x and www.evil.example",
    "_www.evil.example (www.evil.example) ~WWW.EVIL.EXAMPLE ftp://evil.example",
    "mail@evil.example",
    "<img src=x onerror=alert(1)>",
    "&lt;b&gt; &amp; entities",
    "**bold** _em_ ~~gone~~",
    "![img](https://evil.example/p.png)",
    "| --- | --- |",
    "back\\slash at the end \\",
    "\u202eright-to-left override",
    " padded ",
    "",
)

#: Elements no model text may create, and the summaries never write themselves (they have
#: headings of level 2 to 4, bold and italic words of their own).
FOREIGN = ("a", "script", "img", "h1", "del", "iframe", "style")


def shown(text: str) -> str:
    """What a cell must show for ``text``: line breaks as ``↵``, the override replaced,
    ``(empty)`` for nothing."""
    text = re.sub(r"\r\n|\r|\n", "↵", text).replace("\u202e", "\ufffd")
    return text or "(empty)"


class Rendered(HTMLParser):
    """The HTML of a Markdown text: its elements, and each table as rows of cell texts."""

    def __init__(self, markdown: str) -> None:
        super().__init__(convert_charrefs=True)
        self.html = cmarkgfm.github_flavored_markdown_to_html(
            markdown, options=Options.CMARK_OPT_UNSAFE
        )
        self.tags: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self.feed(self.html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def foreign(self) -> list[str]:
        """The elements model text must never create, as found."""
        return [t for t in self.tags if t in FOREIGN]
