"""No function or method of the package is over :data:`MAX_FUNCTION_LINES` lines.

A function a reader cannot take in at once hides its steps; past this length it is split
into named steps (an option table becomes data, a long orchestration its stages). Counted
from the ``def`` line to the last line of the body, docstring and comments included, as an
editor shows it; nested functions count inside their parent and on their own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_memeval"
MAX_FUNCTION_LINES = 80


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method under ``tree``: its qualified name and its line count."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield f"{prefix}{node.name}", node.end_lineno - node.lineno + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _too_long(source: str, name: str) -> list[str]:
    return [
        f"{name}:{qualname} ({lines} lines)"
        for qualname, lines in _functions(ast.parse(source))
        if lines > MAX_FUNCTION_LINES
    ]


def test_no_function_in_the_package_is_over_the_limit() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50  # the package itself, not an empty glob
    long = [
        found
        for path in modules
        for found in _too_long(
            path.read_text(encoding="utf-8"), path.relative_to(PACKAGE.parent).as_posix()
        )
    ]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_check_counts_methods_and_nested_functions_by_name() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f"class C:\n    def method(self):\n{body}\n        def inner():\n            pass\n"
    assert _too_long(source, "m.py") == [f"m.py:C.method ({MAX_FUNCTION_LINES + 3} lines)"]
    short = "def f():\n" + "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    assert _too_long(short, "m.py") == []
