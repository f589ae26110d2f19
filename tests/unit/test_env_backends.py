"""Which environment a spec gets, and the one clear error when it cannot be made here.

No JVM starts in this module (each TextWorld Express error below is raised before it would);
the backend's real episodes are in tests/integration/test_env_textworld.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from pytest_memeval import hookspecs
from pytest_memeval.compat import installed_version
from pytest_memeval.env import (
    BUILTIN_BACKENDS,
    EnvSetupError,
    EnvSpec,
    GymnasiumTextEnv,
    TerminationReason,
    TextEnv,
    describe_env,
    make_env,
    parse_env_spec,
    run_episode,
)

from ..envs import require_gymnasium, require_textworld, say_the_word_env, scripted, twc_spec

SAY_ID = "memeval-test/SayTheWord-v0"


@pytest.fixture(scope="module")
def say_id() -> Iterator[str]:
    gymnasium = require_gymnasium()
    gymnasium.register(id=SAY_ID, entry_point=say_the_word_env(gymnasium))
    yield SAY_ID
    del gymnasium.registry[SAY_ID]


def _gym_spec(game: str, **params: Any) -> EnvSpec:
    return parse_env_spec({"backend": "gymnasium", "game": game, "seeds": "0-2", "params": params})


def test_the_built_in_backends() -> None:
    assert sorted(BUILTIN_BACKENDS) == ["gymnasium", "textworld_express"]


def test_an_unknown_backend_names_the_built_in_ones_and_the_hook() -> None:
    with pytest.raises(EnvSetupError) as info:
        make_env(parse_env_spec({"backend": "alfworld", "game": "pick", "seeds": 0}))
    assert str(info.value) == (
        "env.backend: no backend 'alfworld'; built in: gymnasium, textworld_express "
        "(a plugin adds one with the pytest_memeval_make_env hook)"
    )


def test_a_registered_gymnasium_id_with_its_params_is_a_text_env(say_id: str) -> None:
    env = make_env(_gym_spec(say_id, max_turns=2))
    assert isinstance(env, GymnasiumTextEnv) and isinstance(env, TextEnv)
    episode = run_episode(env, 0, scripted(["zebra"] * 3), max_steps=3)
    env.close()
    assert episode.reason is TerminationReason.ENV_TRUNCATED  # max_turns=2 reached gymnasium
    assert len(episode.steps) == 2


def test_a_fingerprint_names_the_spec_and_the_backends_version(say_id: str) -> None:
    spec = _gym_spec(say_id, max_turns=2)
    env = make_env(spec)
    env.close()
    described = describe_env(env, spec)
    assert described == {**spec.as_plain(), "version": installed_version("gymnasium")}
    assert described["game"] == say_id and described["params"] == {"max_turns": 2}


def test_a_gymnasium_env_without_text_is_refused(say_id: str) -> None:
    with pytest.raises(EnvSetupError) as info:
        make_env(_gym_spec("CartPole-v1"))
    assert str(info.value) == (
        "env.game: 'CartPole-v1' has a Box observation_space; the closed loop needs text "
        "observations and actions (gymnasium.spaces.Text)"
    )


def test_an_unknown_gymnasium_id_says_where_the_ids_are(say_id: str) -> None:
    with pytest.raises(EnvSetupError) as info:
        make_env(_gym_spec("memeval-test/Nope-v0"))
    message = str(info.value)
    assert message.startswith("env.game: gymnasium cannot make 'memeval-test/Nope-v0' (")
    assert "gymnasium.pprint_registry()" in message


def test_the_hook_is_asked_first_and_none_falls_through(say_id: str) -> None:
    made: list[EnvSpec] = []

    def plugin(spec: EnvSpec) -> TextEnv | None:
        made.append(spec)
        return None

    spec = _gym_spec(say_id)
    env = make_env(spec, plugin)
    env.close()
    assert made == [spec] and isinstance(env, GymnasiumTextEnv)
    mine = make_env(parse_env_spec({"backend": "mine", "game": "g", "seeds": 1}), lambda s: env)
    assert mine is env  # a backend no built-in knows, from the plugin


def test_the_hookspec_is_firstresult_through_pluggy(say_id: str) -> None:
    """The real hook machinery: the first implementation that returns an env wins."""
    gymnasium = require_gymnasium()
    env = GymnasiumTextEnv(gymnasium.make(say_id))

    class Declines:
        @pytest.hookimpl
        def pytest_memeval_make_env(self, config: Any, spec: EnvSpec) -> TextEnv | None:
            return None

    class Provides:
        @pytest.hookimpl
        def pytest_memeval_make_env(self, spec: EnvSpec) -> TextEnv | None:
            return env if spec.backend == "say" else None

    manager = pluggy.PluginManager("pytest")
    manager.add_hookspecs(hookspecs)
    manager.register(Provides())
    manager.register(Declines())  # registered last: called first
    spec = parse_env_spec({"backend": "say", "game": say_id, "seeds": 0})

    def hook(s: EnvSpec) -> TextEnv | None:
        result: TextEnv | None = manager.hook.pytest_memeval_make_env(config=None, spec=s)
        return result

    assert make_env(spec, hook) is env
    with pytest.raises(EnvSetupError, match="no backend 'other'"):
        make_env(parse_env_spec({"backend": "other", "game": "x", "seeds": 0}), hook)
    env.close()


def test_a_missing_textworld_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import textworld_express` raise ImportError: the package
    # absent, as for a user without the extra
    monkeypatch.setitem(sys.modules, "textworld_express", None)
    with pytest.raises(EnvSetupError) as info:
        make_env(twc_spec())
    message = str(info.value)
    assert message.startswith("the textworld_express backend needs the textworld-express ")
    assert message.endswith(": pip install 'pytest-memeval[textworld]'")


def test_a_missing_java_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_textworld()
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no java on it
    with pytest.raises(EnvSetupError) as info:
        make_env(twc_spec())
    message = str(info.value)
    assert "there is no `java` on PATH: install Java 17 or newer" in message
    assert "openjdk-17-jre-headless" in message


def test_an_unknown_game_lists_the_games() -> None:
    require_textworld()
    with pytest.raises(EnvSetupError) as info:
        make_env(twc_spec(game="alfred"))
    assert str(info.value) == (
        "env.game: TextWorld Express has no game 'alfred'; its games: cookingworld, coin, "
        "twc, mapreader, arithmetic, sorting, simonsays, peckingorder"
    )


def test_an_unknown_fold_lists_the_folds() -> None:
    require_textworld()
    with pytest.raises(EnvSetupError, match=r"^env\.fold: TextWorld Express folds are train, "):
        make_env(twc_spec(fold="valid"))
