"""Shared helpers for the closed-loop environment tests (env/).

TextWorld Express and Java are in the test extra and on CI: there a missing one fails the
tests that need it; elsewhere (a checkout without the extra) they are skipped.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_memeval.env import EnvSpec, Message, parse_env_spec

from .conftest import ADAPTERS, BASE_MODEL, INNER_ADDOPTS

#: a small household clean-up: one room, two objects, no doors (six gold actions)
TWC_TABLE: dict[str, Any] = {
    "backend": "textworld_express",
    "game": "twc",
    "params": "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0",
    "fold": "test",
    "seeds": "0-9",
    "max_steps": 12,
}


#: TWC_TABLE's game as keys of a TOML inline table (one line), without its seeds and limits
TWC_TOML = (
    f'backend = "textworld_express", game = "twc", params = "{TWC_TABLE["params"]}", fold = "test"'
)


def twc_profile(name: str, seeds: str, *, adapter: str = "oracle", extra: str = "") -> str:
    """A ``[tool.memeval.ckpt.NAME]`` profile for the pytester runs: the base model with the
    test adapter ``adapter``, 6 new tokens, :data:`TWC_TOML`'s game on ``seeds`` with 2 steps
    (``extra``: more env keys, as ``, key = value``)."""
    return textwrap.dedent(
        f"""
        [tool.memeval.ckpt.{name}]
        model = "{BASE_MODEL.as_posix()}"
        adapter = "{(ADAPTERS / adapter).as_posix()}"
        generation = {{ max_new_tokens = 6 }}
        env = {{ {TWC_TOML}, seeds = "{seeds}", max_steps = 2{extra} }}
        """
    )


def write_pyproject(root: Path, profiles: str, conftest: str = "") -> None:
    """Write ``root/pyproject.toml`` (the inner runs' addopts, then ``profiles``) and, when
    given, ``root/conftest.py`` (``conftest`` dedented)."""
    text = f'[tool.pytest.ini_options]\naddopts = "{INNER_ADDOPTS}"\n' + profiles
    (root / "pyproject.toml").write_text(text, "utf-8")
    if conftest:
        (root / "conftest.py").write_text(textwrap.dedent(conftest), "utf-8")


def twc_spec(**changes: Any) -> EnvSpec:
    return parse_env_spec({**TWC_TABLE, **changes})


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the closed-loop tests: {reason}")
    pytest.skip(reason)


def require_textworld() -> None:
    """Skip (fail on CI) unless textworld-express and a ``java`` are installed."""
    try:
        import textworld_express  # noqa: F401
    except ImportError:
        _missing("textworld-express is not installed (pip install -e '.[textworld]')")
    if shutil.which("java") is None:
        _missing("no java on PATH (TextWorld Express needs Java 17)")


def require_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError:
        _missing("gymnasium is not installed (pip install -e '.[test]')")
    return gymnasium


def java_children() -> list[int]:
    """The pids of this process's children whose command is ``java`` (Linux: /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while the walk read it
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == os.getpid() and name == "java":
            found.append(int(stat.parent.name))
    return sorted(found)


def marked_processes(value: str) -> list[str]:
    """The command lines (first 120 characters) of the processes whose environment holds
    ``MEMEVAL_TEST_RUN_MARK=value``: a run's own processes, its JVMs included."""
    needle = f"MEMEVAL_TEST_RUN_MARK={value}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:  # ended while we looked, or not ours to read
            continue
    return [c.decode(errors="replace")[:120] for c in found]


def no_jvm_left(value: str) -> None:
    """Fail if a JVM of the run marked ``value`` is still running."""
    left = [c for c in marked_processes(value) if "java" in c]
    assert not left, f"JVMs left after the run: {left}"


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def scripted(actions: Sequence[str]) -> Any:
    """A policy that plays ``actions`` in order (and checks it is asked no more often)."""
    queue: Iterator[str] = iter(actions)

    def policy(messages: Sequence[Message]) -> str:
        return next(queue)

    return policy


#: the words of :func:`say_the_word_env`'s game
WORDS = ("apple", "brick", "cloud")


def say_the_word_env(gymnasium: Any) -> type[Any]:
    """A real ``gymnasium.Env`` (Text spaces; passes Gymnasium's ``check_env``): the seed
    picks a word, the observation names it, saying it wins. ``max_turns`` is the env's own
    limit (Gymnasium's ``truncated``)."""
    import string

    from gymnasium.spaces import Text

    class SayTheWord(gymnasium.Env):
        metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

        def __init__(self, max_turns: int = 100) -> None:
            self.observation_space = Text(max_length=200, charset=string.printable)
            self.action_space = Text(max_length=20, charset=string.ascii_lowercase)
            self.max_turns = max_turns
            self.target = WORDS[0]
            self.turns = 0

        def reset(
            self, *, seed: int | None = None, options: dict[str, Any] | None = None
        ) -> tuple[str, dict[str, Any]]:
            super().reset(seed=seed)
            self.target = WORDS[int(self.np_random.integers(len(WORDS)))]
            self.turns = 0
            info = {"task_description": "Say the secret word.", "valid_actions": list(WORDS)}
            return f"  Say the word {self.target}.  \n", {**info, "score": 0.0}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            self.turns += 1
            won = action == self.target
            said = "Not that one." if action in WORDS else "Unknown word."
            info = {"is_success": won, "valid_actions": list(WORDS), "score": float(won)}
            truncated = not won and self.turns >= self.max_turns
            return ("Yes!" if won else said), float(won), won, truncated, info

    return SayTheWord
