"""Reading the HTML pages the plugin writes, and runs whose model text tries to inject markup.

Shared by the report tests (parsed in Python) and the browser test (a real Chromium).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from .runfactory import make_record, write_run

#: A prediction that would run script, break out of a cell and load an image if unescaped.
INJECTED = (
    "</span></td><script>document.title='pwned';"
    "document.body.insertAdjacentHTML('beforeend','<p id=pwned>owned</p>')</script>"
    "<img src=x onerror=\"document.title='pwned'\">"
)


class Page(HTMLParser):
    """Elements and text of a page, as a browser's parser would see them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)
        else:
            self.text.append(data)


def injected_runs(tmp: Path) -> tuple[Path, Path]:
    """Two small runs; B's prediction for s2 (and a turn of s1) tries to inject markup."""
    a = write_run(
        tmp / "a",
        [
            make_record("s1", 0, final_match=True),
            make_record("s2", 1, final_match=True),
            make_record("s3", 2, final_match=False),
        ],
        ckpt="base",
    )
    b = write_run(
        tmp / "b",
        [
            make_record(
                "s1",
                0,
                final_match=True,
                turn_preds=[INJECTED, "place mug in sink"],
                turn_matches=[False, True],
            ),
            make_record("s2", 1, final_match=False, final_pred=INJECTED),
            make_record(
                "s3",
                2,
                final_match=True,
                targets=["pick mug from counter", "open cabinet", "place mug in sink"],
                chain=["pick mug from counter", "place mug in sink"],
            ),
        ],
        ckpt="cand<b>",  # labels are escaped too
    )
    return a, b
