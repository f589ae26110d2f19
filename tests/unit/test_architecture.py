"""The package layout as docs/architecture.md states it, checked on the source.

Folders follow the data flow and form layers: a module imports only from its own folder or
from a folder below it, never upward, and the module graph has no cycle. Imports inside a
function are allowed only for heavy third-party dependencies (deferred so that a plain
``pytest`` or ``memeval compare`` never loads torch), never to dodge a cycle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_memeval"

#: lowest first; the package's top-level modules (plugin, hookspecs, public modules) sit above all
LAYERS = ("compat", "core", "model", "decode", "runtime", "guards", "tools")
TOP = len(LAYERS)

#: third-party modules a function may import lazily, and why (each loads slowly or is optional)
DEFERRABLE = {
    "torch": "heavy (seconds): only when a model is loaded",
    "transformers": "heavy: only when a model or tokenizer is loaded",
    "peft": "heavy: only when an adapter is loaded",
    "safetensors": "only when a checkpoint is read",
    "pytest_html": "optional dependency",
    "execnet": "only under xdist",
    "xdist": "only under xdist",
    "syrupy": "only for the byte guards",
    "jinja2": "only when a page is rendered",
    "numpy": "only for statistics",
    "tomllib": "3.11+ / tomli backport choice",
    "tomli": "3.11+ / tomli backport choice",
}


@functools.cache
def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def _imports(name: str, path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """(internal modules imported anywhere, [(line, module)] of imports inside functions)."""
    modules = _modules()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    internal: set[str] = set()
    lazy: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                targets = _resolve(name, path.name == "__init__.py", child)
            for target in targets:
                if target in modules and target != name:
                    internal.add(target)
            if targets and in_function:
                lazy.append((child.lineno, targets[0]))
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, nested)

    visit(tree, False)
    return internal, lazy


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


@functools.cache
def _graph() -> dict[str, set[str]]:
    return {name: _imports(name, path)[0] for name, path in _modules().items()}


def test_every_module_lives_in_a_layer_folder_or_is_a_thin_top_module() -> None:
    top = sorted(n for n in _modules() if _layer(n) == TOP and n != "pytest_memeval")
    assert top == [
        "pytest_memeval.__main__",
        "pytest_memeval.evaluation",
        "pytest_memeval.guard_tests",
        "pytest_memeval.hookspecs",
        "pytest_memeval.plugin",
    ]


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_imports_upward(module: str) -> None:
    here = _layer(module)
    upward = sorted(t for t in _graph()[module] if _layer(t) > here and t != "pytest_memeval")
    assert upward == [], f"{module} (layer {here}) imports {upward}"


def test_the_module_graph_has_no_cycle() -> None:
    graph = _graph()
    # A package's __init__ is imported on the way to any of its modules: an edge from a
    # module to its own package is not a dependency in the design's sense.
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_function_level_imports_only_defer_heavy_dependencies(module: str) -> None:
    _, lazy = _imports(module, _modules()[module])
    bad = [
        f"line {line}: {target}"
        for line, target in lazy
        if target.split(".")[0] not in DEFERRABLE and target.split(".")[0] != "_pytest"
    ]
    assert bad == [], f"{module} imports inside functions: {bad}"
