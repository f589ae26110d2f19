"""The README's CI recipe passes on the demo, run exactly as written.

The commands are read from README.md (the fenced block after ``<!-- ci-recipe -->``), so the
recipe a user copies and the one tested cannot differ. They run in a copy of this project (its
``pyproject.toml``, root ``conftest.py`` and ``contracts/``, the demo linked in), so the runs
they write stay out of the checkout. ``pytest`` and ``memeval`` run with this interpreter.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from .. import forkserver
from ..conftest import INNER_ADDOPTS, REPO

MARK = "<!-- ci-recipe -->"
#: The modules the README's programs run (``python -m MODULE``).
_PROGRAMS = {"pytest": "pytest", "memeval": "pytest_memeval"}


def recipe_commands(readme: str) -> list[list[str]]:
    """The commands of the fenced block right after the ``ci-recipe`` mark: one per line,
    comments and blank lines dropped, backslash continuations joined."""
    after = readme.split(MARK, 1)
    assert len(after) == 2, f"README.md has no {MARK} block"
    block = re.match(r"\s*```[a-z]*\n(.*?)^```", after[1], re.DOTALL | re.MULTILINE)
    assert block is not None, f"README.md: no fenced code block right after {MARK}"
    joined = block.group(1).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def test_the_recipe_is_read_from_the_readme_block() -> None:
    readme = (
        f"text\n{MARK}\n```sh\n# a comment\npytest -n 2 \\\n  --ckpt x  # why\n\n"
        "memeval recount r\n```\nrest\n"
    )
    assert recipe_commands(readme) == [
        ["pytest", "-n", "2", "--ckpt", "x"],
        ["memeval", "recount", "r"],
    ]
    with pytest.raises(AssertionError, match="no <!-- ci-recipe --> block"):
        recipe_commands("no mark here")


def _project_copy(root: Path) -> Path:
    root.mkdir()
    for name in ("pyproject.toml", "conftest.py"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "contracts", root / "contracts")
    (root / "demo").symlink_to(REPO / "demo", target_is_directory=True)
    return root


@pytest.mark.slow
def test_the_readme_ci_recipe_passes_on_the_demo(tmp_path: Path) -> None:
    commands = recipe_commands((REPO / "README.md").read_text("utf-8"))
    assert [c[0] for c in commands] == ["pytest", "memeval", "pytest"], commands
    gated = commands[-1]
    assert "--memeval-min-m1" in " ".join(gated) and "--memeval-max-drop" in " ".join(gated)
    project = _project_copy(tmp_path / "project")
    python = forkserver.interpreter({**os.environ, "PYTEST_ADDOPTS": INNER_ADDOPTS})
    for words in commands:
        done = subprocess.run(
            [python.executable, "-m", _PROGRAMS[words[0]], *words[1:]],
            cwd=project,
            env=python.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        shown = " ".join(words)
        assert done.returncode == 0, (
            f"{shown}: exit {done.returncode}\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
        )
        if words[0] == "pytest" and "--memeval-min-m1" in words:
            assert "gate PASSED: exit status 0" in done.stdout, shown
            assert "m1 final-query: 127/189 = 67.20%" in done.stdout, shown  # as the README says
            assert "\nWARN" not in done.stdout, f"{shown}: the gate warns\n{done.stdout[-3000:]}"
    assert (project / "ci" / "reference" / "oracle" / "metrics.json").is_file()
    assert (project / "runs" / "oracle" / "metrics.json").is_file()
    assert (project / "eval.xml").is_file()
