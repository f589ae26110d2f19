"""The Jinja2 environment of the HTML pages: templates in ``tools/report/templates/``, static
files in ``tools/report/static/``.

Every template is autoescaped: whatever a template prints (a prediction, a scenario id, a run
label, a path) comes out as text, never markup, with no escaping by hand. ``StrictUndefined``
makes a misspelt field fail the render instead of printing an empty string. The page's CSS and
JS are package files that the base template inlines (the report is one file that loads
nothing); they are the only text a template marks ``|safe``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.ids import param_id
from pytest_memeval.tools.compare import fmt_ci, fmt_m2_ci, fmt_pp, fmt_pp_ci, fmt_rate

if TYPE_CHECKING:
    import jinja2

__all__ = [
    "FILTERS",
    "TEMPLATE_PACKAGE",
    "environment",
    "render",
    "short_label",
    "short_path",
    "static_text",
]

#: the package whose ``templates/`` and ``static/`` folders hold the page's files
TEMPLATE_PACKAGE = "pytest_memeval.tools.report"


@functools.cache
def static_text(name: str) -> str:
    """The text of ``tools/report/static/<name>`` (our own file: inlined into the page as it is)."""
    return (resources.files(TEMPLATE_PACKAGE) / "static" / name).read_text("utf-8")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else percent(value)


def short_label(label: str, limit: int = 18) -> str:
    """A run label cut from the left to ``limit`` characters (chart labels have little room)."""
    return label if len(label) <= limit else "…" + label[-(limit - 1) :]


def short_path(path: str, parts: int = 2) -> str:
    """A run's path cut to its last ``parts`` components (``…/runs/oracle``): the page shows
    it under the run's label, with the full path on hover (its ``title``)."""
    pieces = [p for p in path.replace("\\", "/").split("/") if p]
    if len(pieces) <= parts:
        return path
    return "…/" + "/".join(pieces[-parts:])


#: the formatting the templates use, by name: the same functions as the terminal's
FILTERS: Mapping[str, Callable[..., str]] = {
    "rate": fmt_rate,
    "ci": fmt_ci,
    "m2ci": fmt_m2_ci,
    "pp": fmt_pp,
    "ppci": fmt_pp_ci,
    "pct": _pct,
    "short": short_label,
    "path": short_path,
    "pid": param_id,
    "f1": lambda value: f"{value:.1f}",  # SVG coordinates
    "g4": lambda value: f"{value:.4g}",  # p-values
}


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment (built on first use): autoescape on, undefined names an error."""
    # Imported here, not at the top: jinja2 loads only when a page is rendered, not on every
    # pytest start (the plugin imports the pytest-html integration, which imports this module).
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, "templates"),
        # Every template (and a template from a string) is escaped, whatever its extension.
        autoescape=jinja2.select_autoescape(("html",), default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        # Block tags on lines of their own leave no blank lines or indentation behind.
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(FILTERS)
    env.globals["static"] = static_text
    return env


def render(name: str, /, **context: Any) -> str:
    """Render ``tools/report/templates/<name>`` with ``context``."""
    return environment().get_template(name).render(**context)
