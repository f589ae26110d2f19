"""The built-in backend: TextWorld Express (``pip install 'pytest-memeval[textworld]'``).

One :class:`TextWorldExpress` is one JVM (started through py4j) with one game loaded;
``reset(seed)`` generates that seed's episode in the spec's fold, ``step`` sends an action.
``close`` stops the JVM and waits for it to exit, so that no Java process outlives it.
textworld_express is imported only when a backend is made: an optional extra.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from pytest_memeval.compat import installed_version
from pytest_memeval.compat.textworld_express import (
    close_env,
    java_process,
    mark_disconnected,
)
from pytest_memeval.env.protocol import EnvInfo, EnvSetupError, StepResult
from pytest_memeval.env.spec import EnvSpec

__all__ = [
    "BACKEND",
    "DEFAULT_CLOSE_TIMEOUT_S",
    "DEFAULT_FOLD",
    "EXTRA_HINT",
    "FOLDS",
    "TextWorldExpress",
    "import_textworld_express",
    "require_java",
]

BACKEND = "textworld_express"
#: TextWorld Express's data splits (for ``twc``, disjoint sets of household objects)
FOLDS = ("train", "dev", "test")
#: the fold of a spec that names none: an evaluation is on held-out data
DEFAULT_FOLD = "test"
EXTRA_HINT = "pip install 'pytest-memeval[textworld]'"
#: TextWorld Express ends an episode itself after ``envStepLimit`` moves; the episode runner
#: owns the step limit (``max_steps``), so the simulator's own is set out of reach
_NO_STEP_LIMIT = 1_000_000
#: seconds ``close`` waits for the JVM to exit after asking it to, before killing it
DEFAULT_CLOSE_TIMEOUT_S = 10.0
#: the info fields kept in ``EnvInfo.extra`` (the rest have typed names or are repeats)
_EXTRA_KEYS = ("numMoves", "scoreRaw", "inventory", "look", "lastActionStr")


def import_textworld_express() -> Any:
    """The ``textworld_express`` module, or :class:`EnvSetupError` saying how to install it."""
    try:
        import textworld_express
    except ImportError as exc:
        raise EnvSetupError(
            f"the {BACKEND} backend needs the textworld-express package, which is not "
            f"installed ({exc}): {EXTRA_HINT}"
        ) from exc
    return textworld_express


def require_java() -> str:
    """The ``java`` on PATH that py4j will start, or :class:`EnvSetupError` if there is none."""
    java = shutil.which("java")
    if java is None:
        raise EnvSetupError(
            f"the {BACKEND} backend runs TextWorld Express in a Java VM, and there is no "
            "`java` on PATH: install Java 17 or newer (for example `apt-get install "
            "openjdk-17-jre-headless`) and make sure `java -version` works"
        )
    return java


class TextWorldExpress:
    """A :class:`~pytest_memeval.env.protocol.TextEnv` over ``TextWorldExpressEnv``.

    ``reset`` takes the option ``gold_path`` (bool): generate the seed's gold action
    sequence, then read by :meth:`gold_actions`.
    """

    def __init__(self, spec: EnvSpec, *, close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        module = import_textworld_express()
        self.close_timeout_s = close_timeout_s
        games = tuple(module.GAME_NAMES)
        if spec.game not in games:
            raise EnvSetupError(
                f"env.game: TextWorld Express has no game {spec.game!r}; its games: "
                + ", ".join(games)
            )
        self.fold = spec.fold or DEFAULT_FOLD
        if self.fold not in FOLDS:
            raise EnvSetupError(
                f"env.fold: TextWorld Express folds are {', '.join(FOLDS)}, got {self.fold!r}"
            )
        require_java()
        self.spec = spec
        self.version = installed_version("textworld-express")
        self._closed = False
        try:
            self._env = module.TextWorldExpressEnv(envStepLimit=_NO_STEP_LIMIT)
        except Exception as exc:
            raise EnvSetupError(
                f"TextWorld Express could not start its Java VM ({type(exc).__name__}: {exc}); "
                "it needs Java 17 or newer (`java -version`)"
            ) from exc
        self._process = java_process(self._env)
        try:
            self._env.load(gameName=spec.game, gameParams=spec.params_text)
        except ValueError as exc:
            self.close()
            raise EnvSetupError(
                f"env.params: TextWorld Express refuses {spec.params_text!r} for "
                f"{spec.game!r}: {str(exc).strip()}"
            ) from exc

    @property
    def pid(self) -> int | None:
        """The JVM's process id (``None`` where this textworld-express hides it)."""
        return None if self._process is None else self._process.pid

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, EnvInfo]:
        """Generate ``seed``'s episode in the fold; ``options={"gold_path": True}`` also
        generates its gold action sequence."""
        unknown = sorted(set(options or {}) - {"gold_path"})
        if unknown:
            raise ValueError(f"TextWorld Express resets take the option gold_path, not {unknown}")
        gold = bool((options or {}).get("gold_path", False))
        observation, infos = self._env.reset(seed=seed, gameFold=self.fold, generateGoldPath=gold)
        return str(observation), _env_info(infos)

    def step(self, action: str) -> StepResult:
        """Send ``action``; ``reward`` is the change in score, ``truncated`` never set."""
        observation, reward, done, infos = self._env.step(action)
        return StepResult(str(observation), float(reward), bool(done), False, _env_info(infos))

    def gold_actions(self) -> tuple[str, ...]:
        """The gold action sequence of the episode last reset with ``gold_path``."""
        if not getattr(self._env, "goldPathGenerated", False):
            raise RuntimeError("no gold path: reset with options={'gold_path': True} first")
        return tuple(str(a) for a in self._env.getGoldActionSequence())

    def describe(self) -> dict[str, Any]:
        """The backend, its version and the fold it resolved, for a run's fingerprint."""
        return {"backend": BACKEND, "version": self.version, "fold": self.fold}

    def close(self) -> None:
        """Stop the JVM and wait for it to exit; idempotent.

        A JVM that does not exit within ``close_timeout_s`` is killed: one that hangs (the
        reason an episode timed out) would not answer py4j's shutdown either, so the
        shutdown runs in a daemon thread that is not waited for past that time.
        """
        if self._closed:
            return
        self._closed = True
        closer = threading.Thread(target=self._close_gateway, name="memeval-twx-close", daemon=True)
        closer.start()
        closer.join(self.close_timeout_s)
        _reap(self._process, self.close_timeout_s)
        # the JVM is gone now, whether its shutdown was answered or not
        mark_disconnected(self._env)

    def _close_gateway(self) -> None:
        # Closing a gateway whose JVM died may still raise; waiting for (or killing) the
        # process is what guarantees that none is left, and close() does that regardless.
        with contextlib.suppress(Exception):
            close_env(self._env)


def _reap(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if process is None:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


def _env_info(infos: Mapping[str, Any]) -> EnvInfo:
    return EnvInfo(
        task_description=str(infos["taskDescription"]),
        valid_actions=tuple(str(a) for a in infos["validActions"]),
        score=float(infos["score"]),
        success=bool(infos["tasksuccess"]),
        failure=bool(infos["taskfailure"]),
        extra={k: infos[k] for k in _EXTRA_KEYS if k in infos},
    )
