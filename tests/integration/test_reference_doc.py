"""docs/reference.md against the code: every option, ini key, hook and ``memeval`` command.

The names come from where the code defines them: ``pytest --help`` (options and ini keys of
every module that registers some), ``pytest_memeval.hookspecs`` (hooks, their arguments and
the first line of their docstrings) and the ``memeval`` command's own argument parsers
(subcommands, ``memeval slurm`` actions and their options). Each mismatch is named with what
to do: "add X to docs/reference.md" or "remove X from docs/reference.md".
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import subprocess
from collections.abc import Callable
from typing import NamedTuple

import pytest

from pytest_memeval import hookspecs
from pytest_memeval.tools.cli import COMMANDS, main

from .. import forkserver
from ..conftest import REPO

REFERENCE = REPO / "docs" / "reference.md"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Documented ahead of the code that lands them in parallel work; absent from the code they
#: are not stale, and once present they are checked like every other name.
PENDING_COMMANDS: set[str] = set()
PENDING_HOOKS: set[str] = set()

_OPTION_LINE = re.compile(r"^ {2}(--memeval-[a-z0-9-]+|--ckpt)\b", re.MULTILINE)
_INI_LINE = re.compile(r"^ {2}(memeval_[a-z0-9_]+) \(", re.MULTILINE)
_LONG_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")
#: An option's own line in argparse's help (``  -o OUT, --out OUT``), not a mention in a text.
_ARGPARSE_OPTION = re.compile(r"^ {2}(?:-[a-zA-Z](?: \S+)?, )?(--[a-z][a-z0-9-]*)", re.MULTILINE)
_HEADING = re.compile(r"^(#{2,4}) (.+)$", re.MULTILINE)


class Section(NamedTuple):
    """One heading of the reference and the text under it, up to the next heading."""

    level: int
    title: str
    body: str


def sections(text: str) -> list[Section]:
    """The page cut at every ``##``, ``###`` and ``####`` heading."""
    found = list(_HEADING.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [
        Section(len(m.group(1)), m.group(2).strip(), text[m.end() : end])
        for m, end in zip(found, ends, strict=True)
    ]


def part(text: str, title: str) -> str:
    """Everything under the ``##`` heading ``title`` (its subsections included)."""
    start = ("\n" + text).index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def first_cells(text: str) -> list[str]:
    """The first cell of every table row in ``text`` (header and rule rows left out)."""
    cells = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells.append(re.split(r"(?<!\\)\|", line)[1].strip())
    return [c for c in cells if c.startswith("`")]


def mismatch(kind: str, in_code: set[str], documented: set[str], pending: set[str]) -> list[str]:
    """What the reference lacks and what it documents that the code does not have."""
    missing = [f"add {kind} {name} to docs/reference.md" for name in sorted(in_code - documented)]
    stale = [
        f"remove {kind} {name} from docs/reference.md (not in the code)"
        for name in sorted(documented - in_code - pending)
    ]
    return missing + stale


@pytest.fixture(scope="module")
def reference() -> str:
    return REFERENCE.read_text("utf-8")


@pytest.fixture(scope="module")
def pytest_help(run_pytest: Callable[..., str]) -> str:
    return run_pytest("--help")


@pytest.fixture(scope="module")
def run_pytest(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``pytest ARGS`` in a process of its own, in an empty directory: its standard output."""
    where = tmp_path_factory.mktemp("help")

    def run(*args: str) -> str:
        python = forkserver.interpreter()
        done = subprocess.run(
            [python.executable, "-m", "pytest", "-p", "no:randomly", *args],
            cwd=where,
            env=python.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    return run


def memeval_help(*argv: str) -> str:
    """``memeval ARGV --help``, run in this process: its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return out.getvalue()


def slurm_actions() -> list[str]:
    listing = memeval_help("slurm").split("positional arguments:")[1].split("options:")[0]
    return re.findall(r"^ {4}([a-z][a-z-]*)(?:\s|$)", listing, re.MULTILINE)


def command_options(argv: list[str]) -> set[str]:
    return set(_ARGPARSE_OPTION.findall(memeval_help(*argv))) - {"--help"}


def documented_commands(reference: str) -> dict[str, set[str]]:
    """``memeval`` command (``"compare"``, ``"slurm submit"``) -> the options its table lists."""
    commands: dict[str, set[str]] = {}
    for sec in sections(part(reference, "`memeval` commands")):
        named = re.fullmatch(r"`memeval ([a-z][a-z -]*)`", sec.title)
        if named is None:
            continue
        options = set()
        for cell in first_cells(sec.body):
            options |= set(_LONG_OPTION.findall(cell))
        commands[named.group(1)] = options
    return commands


def test_every_pytest_option_is_documented(pytest_help: str, reference: str) -> None:
    in_code = set(_OPTION_LINE.findall(pytest_help))
    assert "--ckpt" in in_code and "--memeval-min-m1" in in_code, pytest_help[-3000:]
    documented = set()
    for cell in first_cells(part(reference, "pytest options")):
        documented |= {o for o in _LONG_OPTION.findall(cell) if o.startswith(("--memeval", "--ck"))}
    assert mismatch("the pytest option", in_code, documented, set()) == []


def test_every_ini_key_is_documented(pytest_help: str, reference: str) -> None:
    in_code = set(_INI_LINE.findall(pytest_help))
    assert "memeval_out" in in_code, pytest_help[-3000:]
    documented = {c.strip("`") for c in first_cells(part(reference, "ini keys"))}
    assert mismatch("the ini key", in_code, documented, set()) == []


def test_docs_name_only_options_that_exist(pytest_help: str) -> None:
    """README and every page of docs/: a ``--memeval-*`` option they mention exists."""
    in_code = set(_OPTION_LINE.findall(pytest_help))
    stale = []
    for page in DOCS:
        for option in sorted(set(re.findall(r"--memeval-[a-z0-9-]*[a-z0-9]", page.read_text()))):
            if option not in in_code:
                stale.append(f"{page.relative_to(REPO)} mentions {option}, which no longer exists")
    assert stale == []


def _hooks() -> dict[str, Callable[..., object]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("pytest_memeval_")
    }


def _markdown(docstring_line: str) -> str:
    """A docstring's reST literals (````x````) as the Markdown the reference writes (```x```)."""
    return " ".join(docstring_line.replace("``", "`").split())


def test_every_hook_is_documented_with_its_arguments_and_summary(reference: str) -> None:
    hooks_part = part(reference, "Hooks")
    documented = {}
    for sec in sections(hooks_part):
        named = re.fullmatch(r"`(pytest_memeval_\w+)\(([^)]*)\)`", sec.title)
        if named:
            args = [a.strip() for a in named.group(2).split(",") if a.strip()]
            documented[named.group(1)] = (args, " ".join(sec.body.split()))
    hooks = _hooks()
    problems = mismatch("the hook", set(hooks), set(documented), PENDING_HOOKS)
    for name, fn in sorted(hooks.items()):
        if name not in documented:
            continue
        args, body = documented[name]
        params = list(inspect.signature(fn).parameters)
        if args != params:
            problems.append(f"docs/reference.md: {name}({', '.join(args)}) should be ({params})")
        summary = _markdown((inspect.getdoc(fn) or "").splitlines()[0])
        if summary not in body:
            problems.append(f"docs/reference.md: {name} should say its summary {summary!r}")
    assert problems == []


def test_every_memeval_command_and_its_options_are_documented(reference: str) -> None:
    in_code = {name: [name] for name in COMMANDS}
    for action in slurm_actions():
        in_code[f"slurm {action}"] = ["slurm", action]
    assert "slurm submit" in in_code and "slurm status" in in_code
    documented = documented_commands(reference)
    problems = mismatch("the command memeval", set(in_code), set(documented), PENDING_COMMANDS)
    for name, argv in sorted(in_code.items()):
        if name not in documented or name == "slurm":
            continue
        problems += mismatch(
            f"the option of memeval {name}", command_options(argv), documented[name], set()
        )
    assert problems == []


def test_the_check_names_what_to_add_and_what_to_remove() -> None:
    """The failure messages a merge would meet: both directions named, pending names spared."""
    got = mismatch(
        "the hook",
        {"pytest_memeval_a", "pytest_memeval_b"},
        {"pytest_memeval_b", "pytest_memeval_gone", "pytest_memeval_pending"},
        {"pytest_memeval_pending"},
    )
    assert got == [
        "add the hook pytest_memeval_a to docs/reference.md",
        "remove the hook pytest_memeval_gone from docs/reference.md (not in the code)",
    ]
    page = (
        "## `memeval` commands\n\n### `memeval x`\n\n"
        "| option | what |\n|---|---|\n| `-o O`, `--out O` | o |\n"
    )
    assert documented_commands(page) == {"x": {"--out"}}


def test_reference_is_linked_from_the_readme() -> None:
    assert "(docs/reference.md)" in (REPO / "README.md").read_text("utf-8")
