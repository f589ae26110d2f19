"""The package layout as docs/architecture.md states it, checked on the source.

Folders follow the data flow and form layers: a module imports only from its own folder or
from a folder below it, never upward, and the module graph has no cycle. The rules, each a
test below:

* **Every first-party import counts**, however it is written: ``import pytest_memeval.x.y``,
  ``from pytest_memeval.x import y`` (``y`` a module: an edge to it; ``y`` a name: an edge to
  the package ``x``'s ``__init__``, whose layer is ``x``'s), ``from pytest_memeval import
  name`` (an edge to the top-level package, which re-exports core names and so sits above
  every layer), and relative imports. String imports count too: the modules named in
  ``pytest_plugins`` (plugin.py; each must exist and sit below the top level) and the targets
  of ``COMMANDS`` (tools/cli.py; each must exist, be in tools/ and define ``cli_arguments``
  and ``cli_main``).
* **Imports inside a function** are allowed only for the heavy or optional third-party
  packages in :data:`DEFERRABLE` (deferred so that a plain ``pytest`` or ``memeval compare``
  never loads torch), never to dodge a cycle; inside compat/ also for pytest's private
  ``_pytest`` (imported where it is used, so that a missing internal is a fallback, not an
  import error of the whole seam).
* **Third-party internals only in compat/.** ``_pytest`` is private by name: only compat/
  imports it. xdist and syrupy are imported outside compat/ only from the modules in
  :data:`PUBLIC_API` (their documented extension points); anything else of theirs
  (``xdist.scheduler.LoadScopeScheduling`` included: subclassing it means overriding its
  private hooks) goes through compat/. And no module outside compat/ imports an
  underscore name from another package.
* **One import path per name**, in the package and in tests, contracts/ and demo/ alike. A
  package below a layer folder (``tools/compare/``, ``core/records/``, ``decode/fast/``...)
  and env/ are *sealed*: from outside, only the package is imported, never one of its modules
  (``pytest_memeval.tools.compare``, not ``pytest_memeval.tools.compare.load``); an
  underscore module only from its own folder; and each name is imported from one module
  wherever it is used, except by the modules beside it (its sealed package, or else its
  folder), which import it where it is defined. :func:`package_graph` draws the imports
  between packages that docs/architecture.md shows.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_memeval"
ROOT = PACKAGE.name

#: lowest first; the package's top-level modules (plugin, hookspecs, public modules) sit above all
LAYERS = ("compat", "env", "core", "model", "decode", "runtime", "guards", "tools")
TOP = len(LAYERS)

#: third-party packages a function may import lazily, and why (each loads slowly or is optional)
DEFERRABLE = {
    "torch": "heavy (seconds): only when a model is loaded",
    "transformers": "heavy: only when a model or tokenizer is loaded",
    "peft": "heavy: only when an adapter is loaded",
    "pytest_html": "optional dependency",
    "gguf": "optional dependency (the gguf extra): only when a GGUF file is converted",
    "jinja2": "only when a page is rendered (the pytest-html hooks load on every start)",
    "mlflow": "optional dependency (pytest-memeval[mlflow]), and seconds to import",
    "textworld_express": "optional dependency (pytest-memeval[textworld]): when its env is made",
    "gymnasium": "optional dependency (pytest-memeval[gymnasium]): when a Gymnasium env is made",
}

#: packages whose internals are reached only through compat/, with their public modules
#: that any layer may import (module -> why it is public)
GUARDED = ("_pytest", "xdist", "syrupy")
PUBLIC_API = {
    "syrupy.assertion": "SnapshotAssertion, the type of syrupy's documented `snapshot` fixture",
    "syrupy.extensions.single_file": "SingleFileSnapshotExtension, the documented base",
    "syrupy.data": "SnapshotCollection, the type syrupy's extension hooks are documented to pass",
}


@functools.cache
def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _from_targets(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """What ``from P import a, b`` depends on: ``P.a`` where that is a module, else ``P``."""
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    modules = _modules()
    return [
        f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
        for alias in node.names
    ]


def _string_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Module names a module imports by string: ``pytest_plugins`` and ``COMMANDS``."""
    found: list[tuple[int, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        if target.id == "pytest_plugins":
            found += [(node.lineno, name) for name in ast.literal_eval(value)]
        elif target.id == "COMMANDS":
            found += [(node.lineno, spec[0]) for spec in ast.literal_eval(value).values()]
    return found


@functools.cache
def _imports(name: str) -> tuple[frozenset[str], tuple[tuple[int, str, bool], ...]]:
    """(first-party modules imported anywhere, [(line, imported name, inside a function)]).

    The second list has every import, first- and third-party: for ``from P import n`` the
    name is ``P.n``, so that ``from xdist.scheduler import X`` reads ``xdist.scheduler.X``.
    """
    path = _modules()[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    internal: set[str] = set()
    every: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    every.append((child.lineno, alias.name, in_function))
                    if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                        internal.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                prefix = _from_targets(name, path.name == "__init__.py", child)
                for alias, target in zip(child.names, prefix, strict=True):
                    every.append((child.lineno, f"{child.module}.{alias.name}", in_function))
                    if child.level or target == ROOT or target.startswith(ROOT + "."):
                        internal.add(target)
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, nested)

    visit(tree, False)
    internal.update(target for _, target in _string_imports(tree))
    internal.discard(name)
    return frozenset(internal), tuple(every)


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


def _in_compat(module: str) -> bool:
    return module.startswith(f"{ROOT}.compat.") or module == f"{ROOT}.compat"


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    return {name: _imports(name)[0] for name in _modules()}


def test_every_module_lives_in_a_layer_folder_or_is_a_thin_top_module() -> None:
    top = sorted(n for n in _modules() if _layer(n) == TOP and n != ROOT)
    assert top == [
        "pytest_memeval.__main__",
        "pytest_memeval.episodes",
        "pytest_memeval.evaluation",
        "pytest_memeval.guard_tests",
        "pytest_memeval.hookspecs",
        "pytest_memeval.plugin",
    ]


@pytest.mark.parametrize("module", sorted(_modules()))
def test_every_first_party_import_names_a_module_that_exists(module: str) -> None:
    missing = sorted(t for t in _graph()[module] if t not in _modules())
    assert missing == [], f"{module} imports modules that do not exist: {missing}"


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_module_imports_upward(module: str) -> None:
    here = _layer(module)
    upward = sorted(t for t in _graph()[module] if _layer(t) > here)
    assert upward == [], f"{module} (layer {here}) imports {upward}"


def test_plugin_modules_exist_below_the_top_level() -> None:
    plugin = f"{ROOT}.plugin"
    tree = ast.parse(_modules()[plugin].read_text(encoding="utf-8"))
    names = [name for _, name in _string_imports(tree)]
    assert names, "plugin.py lists no pytest_plugins"
    bad = [n for n in names if n not in _modules() or _layer(n) == TOP]
    assert bad == [], f"pytest_plugins names missing or top-level modules: {bad}"


def test_cli_commands_are_tools_modules_with_both_entry_functions() -> None:
    cli = f"{ROOT}.tools.cli"
    tree = ast.parse(_modules()[cli].read_text(encoding="utf-8"))
    names = [name for _, name in _string_imports(tree)]
    assert names, "tools/cli.py's COMMANDS is empty"
    bad = []
    for name in names:
        if name not in _modules() or _layer(name) != LAYERS.index("tools"):
            bad.append(f"{name}: not a module in tools/")
            continue
        body = ast.parse(_modules()[name].read_text(encoding="utf-8")).body
        defined = {n.name for n in body if isinstance(n, ast.FunctionDef)}
        bad += [f"{name}: no {f}()" for f in ("cli_arguments", "cli_main") if f not in defined]
    assert bad == []


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
            if nxt not in state and nxt in edges:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_function_level_imports_only_defer_heavy_dependencies(module: str) -> None:
    def allowed(target: str) -> bool:
        root = target.split(".")[0]
        return root in DEFERRABLE or (root == "_pytest" and _in_compat(module))

    _, every = _imports(module)
    bad = [f"line {line}: {t}" for line, t, lazy in every if lazy and not allowed(t)]
    assert bad == [], f"{module} imports inside functions: {bad}"


@pytest.mark.parametrize("module", sorted(m for m in _modules() if not _in_compat(m)))
def test_third_party_internals_only_in_compat(module: str) -> None:
    _, every = _imports(module)
    bad = []
    for line, target, _lazy in every:
        parts = target.split(".")
        if parts[0] == ROOT or parts[0] == "None":
            continue
        if parts[0] in GUARDED and not any(
            target == public or target.startswith(public + ".") for public in PUBLIC_API
        ):
            bad.append(f"line {line}: {target} (through compat/)")
        elif any(p.startswith("_") and not p.startswith("__") for p in parts):
            bad.append(f"line {line}: {target} (a private name)")
    assert bad == [], f"{module} uses another package's internals: {bad}"


# --------------------------------------------------------------------------- the fast decoder

FAST = f"{ROOT}.decode.fast"
#: the fast decoder's modules (decode/fast/), helpers first, then its stages in the order a
#: scenario meets them, the orchestrating decoder last: a module imports only modules before
#: it, so each stage reads without the ones after it
FAST_MODULES = (
    "rules",
    "stats",
    "logits",
    "bounds",
    "shared",
    "kvcache",
    "plan",
    "answers",
    "forward",
    "pool",
    "verify",
    "generate",
    "probe",
    "exact",
    "calibration",
    "stored",
    "history",
    "decoder",
    "extension",
    "episodes",
)
#: "a stage is a file a newcomer can read top to bottom" (docs/architecture.md)
FAST_MAX_LINES = 400
FAST_MAX_FUNCTION_LINES = 60


def test_the_fast_decoder_is_a_package_of_its_stages_each_importing_only_earlier_ones() -> None:
    found = sorted(n.removeprefix(FAST + ".") for n in _modules() if n.startswith(FAST + "."))
    assert found == sorted(FAST_MODULES)
    for i, name in enumerate(FAST_MODULES):
        module = f"{FAST}.{name}"
        inside = [t.removeprefix(FAST + ".") for t in _graph()[module] if t.startswith(FAST)]
        later = sorted(t for t in inside if t not in FAST_MODULES[:i])
        assert later == [], f"{module} imports later stages (or the package): {later}"
        tree = ast.parse(_modules()[module].read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and doc.split("\n\n")[0].strip(), f"{module}: no one-sentence docstring"


def test_only_the_fast_packages_public_module_is_imported_from_outside() -> None:
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in _graph().items()
        if not m.startswith(FAST)
        for t in targets
        if t.startswith(FAST + ".")
    )
    assert bad == []


@pytest.mark.parametrize("name", FAST_MODULES)
def test_fast_decoder_modules_and_functions_stay_short(name: str) -> None:
    path = _modules()[f"{FAST}.{name}"]
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= FAST_MAX_LINES, f"{path.name}: over {FAST_MAX_LINES} lines"
    long = sorted(
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > FAST_MAX_FUNCTION_LINES
    )
    assert long == [], f"{path.name}: functions over {FAST_MAX_FUNCTION_LINES} lines: {long}"


# ------------------------------------------------------------------- one import path per name

REPO = PACKAGE.parent
#: the trees outside the package whose imports follow the same rules: tests import a name from
#: where the package itself does
CALLERS = ("tests", "contracts", "demo", "conftest.py")
#: layer folders whose ``__init__`` is their public face, as a package below a layer is
PUBLIC_FOLDERS = (f"{ROOT}.env",)
#: packages below a layer whose modules are public one by one (package -> why)
OPEN_PACKAGES = {
    f"{ROOT}.core.builders": (
        "one module a builder (scene_memory, twc_gold); __init__ is their registry"
    ),
}
#: where users import from (README, docs): the top-level package re-exports core names, and the
#: public modules re-export the items a test module collects; no module of the package imports
#: them (they sit above every layer)
USER_FACADES = (ROOT, f"{ROOT}.evaluation", f"{ROOT}.guard_tests")
#: tests that import a module of a sealed package to patch it (module -> why)
PATCHES_A_MODULE = {
    "tests.integration.test_fast_verify": "patches decode.fast.verify's accept",
    "tests.integration.test_fast_verify_packed": "patches decode.fast.verify's VERIFY_ROUNDS",
}


@functools.cache
def _caller_files() -> dict[str, Path]:
    """Module-like names of the files outside the package that import it (tests, demo...)."""
    found = {}
    for entry in CALLERS:
        path = REPO / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            found[".".join(file.relative_to(REPO).with_suffix("").parts)] = file
    return found


@functools.cache
def _sealed() -> tuple[str, ...]:
    """Packages imported only through their ``__init__`` from outside: every package below a
    layer folder (tools/compare/, core/records/, decode/fast/, ...) and :data:`PUBLIC_FOLDERS`."""
    below = [
        n
        for n, p in _modules().items()
        if p.name == "__init__.py" and n.count(".") >= 2 and n not in OPEN_PACKAGES
    ]
    return tuple(sorted(below + list(PUBLIC_FOLDERS)))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _home(module: str) -> str | None:
    """The innermost sealed package that holds ``module`` (``None``: none does)."""
    homes = [p for p in _sealed() if _inside(module, p)]
    return max(homes, key=len) if homes else None


def _siblings(module: str) -> str:
    """The modules that may import ``module`` directly, past any public face: its sealed
    package's, or else its folder's."""
    return _home(module) or module.rsplit(".", 1)[0]


@functools.cache
def _first_party(importer: str) -> tuple[tuple[int, str, str | None], ...]:
    """Every first-party import of a file, from ``import`` statements (not strings):
    ``(line, module, name)``, ``name`` ``None`` where a module itself is imported."""
    path = _modules().get(importer) or _caller_files()[importer]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if _inside(a.name, ROOT)]
        elif isinstance(node, ast.ImportFrom) and (node.level or _inside(node.module or "", ROOT)):
            targets = _from_targets(importer, path.name == "__init__.py", node)
            for alias, target in zip(node.names, targets, strict=True):
                found.append(
                    (
                        node.lineno,
                        target,
                        None
                        if target in _modules() and (target.endswith("." + alias.name))
                        else alias.name,
                    )
                )
    return tuple(found)


@functools.cache
def _bindings(module: str) -> dict[str, tuple[str, str] | None]:
    """The names ``module`` binds at its top level: ``(source module, name)`` for a name it
    imports from a first-party module, ``None`` for one it defines."""
    bound: dict[str, tuple[str, str] | None] = {}
    for _, source, name in _first_party(module):
        if name is not None:
            bound.setdefault(name, (source, name))
    tree = ast.parse(_modules()[module].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = None
        elif isinstance(node, ast.Assign):
            bound.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound[node.target.id] = None
    return bound


def _origin(module: str, name: str) -> tuple[str, str]:
    """Where ``name``, imported from ``module``, is defined (re-exports followed)."""
    seen = set()
    while (module, name) not in seen and module in _modules():
        seen.add((module, name))
        source = _bindings(module).get(name)
        if source is None:
            break
        module, name = source
    return module, name


def _importers() -> list[str]:
    return sorted(_modules()) + sorted(_caller_files())


@pytest.mark.parametrize("importer", _importers())
def test_no_import_reaches_past_a_package_init(importer: str) -> None:
    """Outside a sealed package, only the package is imported, never one of its modules
    (``pytest_memeval.tools.compare``, not ``pytest_memeval.tools.compare.load``); and an
    underscore module only from its own folder. pytest_plugins and COMMANDS name plugin and
    command modules by string, as entry points: they are not imports."""
    bad = []
    for line, module, _name in _first_party(importer):
        home = _home(module)
        patches = importer in PATCHES_A_MODULE and _name is None
        if home is not None and module != home and not _inside(importer, home) and not patches:
            bad.append(f"line {line}: {module} (import {home})")
        private = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
        folder = module.rsplit(".", 1)[0]
        if private and not _inside(importer, folder):
            bad.append(f"line {line}: {module} (a private module of {folder})")
    assert bad == [], f"{importer} reaches into a package: {bad}"


def test_each_name_has_one_import_path() -> None:
    """Each first-party name is imported from one module wherever it is used (the package and
    its tests alike): the module that defines it, or the sealed package that re-exports it.
    Only the modules beside a name's own (in its sealed package, or else its folder) import
    it directly, and users may also use the re-exports of :data:`USER_FACADES`."""
    paths: dict[tuple[str, str], dict[str, list[str]]] = {}
    for importer in _importers():
        for line, module, name in _first_party(importer):
            if name is None or module in USER_FACADES:
                continue
            origin = _origin(module, name)
            if _inside(importer, _siblings(origin[0])):
                continue
            paths.setdefault(origin, {}).setdefault(module, []).append(f"{importer}:{line}")
    several = {
        f"{origin[0]}.{origin[1]}": {m: sorted(where)[:3] for m, where in by.items()}
        for origin, by in sorted(paths.items())
        if len(by) > 1
    }
    assert several == {}, "names imported from several modules:\n" + "\n".join(
        f"  {name}: {by}" for name, by in several.items()
    )


# ------------------------------------------------------------------------------ the import graph

DOC = REPO / "docs" / "architecture.md"
GRAPH_START = "<!-- import graph: generated by `python tests/unit/test_architecture.py` -->"
GRAPH_END = "<!-- end of the import graph -->"


def _unit(module: str, within: str | None = None) -> str | None:
    """The node a module belongs to: its layer folder (``within`` None), or inside the layer
    ``within`` its package or module there (``None``: outside that layer)."""
    parts = module.split(".")[1:]
    if within is None:
        return parts[0] if _layer(module) != TOP else "top level"
    if _layer(module) == TOP or parts[0] != within:
        return None
    return "/".join(parts[:2]) if len(parts) > 1 else parts[0]


def package_graph(within: str | None = None) -> list[tuple[str, str]]:
    """The imports between layer folders (or, ``within`` a layer, between its packages and
    modules), string imports (pytest_plugins, COMMANDS) included, as sorted edges."""
    edges = set()
    for module, targets in _graph().items():
        source = _unit(module, within)
        for target in targets:
            dest = _unit(target, within)
            if source and dest and source != dest:
                edges.add((source, dest))
    return sorted(edges)


def _mermaid(edges: list[tuple[str, str]]) -> list[str]:
    def key(name: str) -> str:
        return name.replace("/", "_").replace(" ", "_")

    nodes = sorted({n for edge in edges for n in edge})
    return [
        "```mermaid",
        "flowchart LR",
        *(f'  {key(n)}["{n}"]' for n in nodes),
        *(f"  {key(a)} --> {key(b)}" for a, b in edges),
        "```",
    ]


def graph_markdown() -> str:
    """The import graph section of docs/architecture.md, between its markers."""
    lines = [
        GRAPH_START,
        "",
        "Between layer folders (an arrow: imports):",
        "",
        *_mermaid(package_graph()),
        "",
        "Inside `tools/` (its subpackages, and its single-module commands):",
        "",
        *_mermaid(package_graph("tools")),
        "",
        GRAPH_END,
    ]
    return "\n".join(lines)


def test_the_documented_import_graph_is_the_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert GRAPH_START in text and GRAPH_END in text, f"{DOC.name}: no import graph section"
    shown = text[text.index(GRAPH_START) : text.index(GRAPH_END) + len(GRAPH_END)]
    assert shown == graph_markdown(), (
        "docs/architecture.md's import graph is out of date: replace its section with the "
        "output of `python tests/unit/test_architecture.py`"
    )


if __name__ == "__main__":
    print(graph_markdown())
