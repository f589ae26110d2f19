"""A closed-loop run's items: ``test_episode[<game>-<seed>]``, one per seed of the profile.

A profile with an ``env`` table (docs/closed-loop.md) makes the run a closed-loop run: its
state (:class:`EpisodeState`) is built at configure, on the controller from the profiles file
(the checkpoint checked, a GGUF converted, the environment made once and closed, so that a
missing Java or extra is one usage error before any item), on an xdist worker from the
controller's plain data. The items come from :mod:`pytest_memeval.episodes`, imported by a
test module or provided by the plugin as ``memeval::test_episode[<id>]`` (as the scenario
items are, runtime/eval_items.py); their ids are ``core/ids.param_id`` of ``<game>-<seed>``.
The worker side (model, environment, the episode of each item) is
:mod:`.worker`; the controller side (journal, run directory, metrics) is
:mod:`.controller`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_memeval.compat import installed_version
from pytest_memeval.compat.pytest import collect_module_object
from pytest_memeval.core.episode_records import episode_id
from pytest_memeval.core.ids import IdMap, param_id, split_item_name
from pytest_memeval.core.profiles import Profile, ProfileError, profile_from_plain
from pytest_memeval.core.sharding import ShardError, select_shard, shard_dir_name, shard_slice
from pytest_memeval.env import EnvSetupError, EnvSpec, TextEnv, describe_env, make_env
from pytest_memeval.model.checks import (
    CheckpointError,
    check_profile_checkpoint,
    fingerprint_dir,
)
from pytest_memeval.model.gguf import prepare_profile
from pytest_memeval.runtime.eval_items import NO_PROFILE_ID, PROVIDED, covers_project
from pytest_memeval.runtime.session import (
    DECODE_PATHS,
    cache_dir,
    controller_profile,
    decoding_fingerprint,
    run_dir_name,
)
from pytest_memeval.runtime.state import is_worker, workerinput

__all__ = [
    "EPISODE_STATE_KEY",
    "SEED_FIXTURE",
    "EpisodeState",
    "build_episode_state",
    "check_not_only_scenario_items",
    "env_maker",
    "episode_items",
    "item_seed",
    "parametrize_episodes",
    "provide_episode_items",
]

#: the fixture the episode items are parametrized over (its value: the seed)
SEED_FIXTURE = "memeval_episode_seed"
#: the packages whose version names a built-in backend in the fingerprints
_BACKEND_DISTRIBUTIONS = {"textworld_express": "textworld-express", "gymnasium": "gymnasium"}


@dataclass
class EpisodeState:
    """A closed-loop run's state (``config.stash[EPISODE_STATE_KEY]``)."""

    profile: Profile
    spec: EnvSpec
    run_dir: Path
    overrides: dict[str, dict[str, str | None]]
    #: model, adapter, tokenizer, decoding and environment fingerprints (the controller's)
    fingerprints: dict[str, Any]
    #: what the run is of: the spec resolved and the backend's own description
    env: dict[str, Any]
    provide_items: bool
    #: --memeval-resume: ids of the episodes the journal already holds (no error)
    resume_done: set[str] = field(default_factory=set)
    #: --memeval-shard K/N: ``(K, N)``; the run is of that slice of the seeds
    shard: tuple[int, int] | None = None
    #: --memeval-decode: ``fast`` (kept caches, episodes stepped together) or ``reference``
    decode_path: str = "fast"

    def ids(self) -> list[str]:
        """Every episode id of the profile, in the order of the spec's seeds."""
        return [episode_id(self.spec, seed) for seed in self.spec.seeds]

    def run_seeds(self) -> list[int]:
        """The seeds this run is of: every seed, or the shard's slice (core/sharding.py,
        the split rule of a scenario run's shards over the seeds' order)."""
        if self.shard is None:
            return list(self.spec.seeds)
        return shard_slice(self.spec.seeds, *self.shard)

    def run_ids(self) -> list[str]:
        """The ids of :meth:`run_seeds`."""
        return [episode_id(self.spec, seed) for seed in self.run_seeds()]


EPISODE_STATE_KEY = pytest.StashKey[EpisodeState]()


def env_maker(config: pytest.Config) -> Any:
    """``make(spec)``: the ``pytest_memeval_make_env`` hook first, then a built-in backend."""

    def plugin(spec: EnvSpec) -> TextEnv | None:
        made: TextEnv | None = config.hook.pytest_memeval_make_env(config=config, spec=spec)
        return made

    def make(spec: EnvSpec) -> TextEnv:
        return make_env(spec, plugin)

    return make


def _describe_setup(config: pytest.Config, spec: EnvSpec) -> dict[str, Any]:
    """Make the environment once and close it: a missing Java, extra or game is one usage
    error now, and the description (backend version, fold) is the fingerprint's."""
    try:
        env = env_maker(config)(spec)
    except EnvSetupError as exc:
        raise pytest.UsageError(f"memeval: the profile's env cannot be made here: {exc}") from None
    try:
        described = describe_env(env, spec)
    finally:
        env.close()
    if "version" not in described and spec.backend in _BACKEND_DISTRIBUTIONS:
        described["version"] = installed_version(_BACKEND_DISTRIBUTIONS[spec.backend])
    return described


def _fingerprints(profile: Profile, conversion: Any, env: dict[str, Any]) -> dict[str, Any]:
    settings = {**profile.generation.as_dict(), "system": profile.system, "policy": "reference"}
    return {
        "model": conversion.fingerprint if conversion else fingerprint_dir(profile.model_dir),
        "adapter": fingerprint_dir(profile.adapter) if profile.adapter else None,
        "tokenizer": fingerprint_dir(profile.tokenizer) if profile.tokenizer else None,
        "decoding": decoding_fingerprint(settings),
        "env": env,
    }


def build_episode_state(config: pytest.Config, name: str) -> EpisodeState | None:
    """The closed-loop state of ``--ckpt NAME``, or ``None`` when the profile has no ``env``.

    Raises :class:`pytest.UsageError` for what the user must fix (profile, checkpoint, env).
    """
    wi = workerinput(config)
    if wi is not None and wi.get("memeval_profile") is not None:
        profile = profile_from_plain(wi["memeval_profile"])
        if profile.env is None:
            return None
        episode = dict(wi.get("memeval_episode_state") or {})
        return EpisodeState(
            profile=profile,
            spec=profile.env,
            run_dir=Path(wi["memeval_run_dir"]),
            overrides=dict(wi.get("memeval_overrides", {})),
            fingerprints=dict(episode.get("fingerprints", {})),
            env=dict(episode.get("env", {})),
            provide_items=bool(wi.get("memeval_provide_items", False)),
            resume_done=set(wi.get("memeval_resume_done", [])),
            shard=_shard_pair(episode.get("shard")),
            decode_path=str(episode.get("decode", "fast")),
        )
    try:
        profile, overrides = controller_profile(config, name)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    spec = profile.env
    if spec is None:
        return None
    where = f"{profile.source}: [tool.memeval.ckpt.{name}]"
    if profile.kind != "model":
        raise pytest.UsageError(f"{where}: 'env' needs a model profile")
    shard = _select_shard(config, spec)
    try:
        profile, conversion = prepare_profile(profile, cache_dir(config), _say)
        check_profile_checkpoint(profile)
    except (ProfileError, CheckpointError) as exc:
        raise pytest.UsageError(str(exc)) from None
    env = _describe_setup(config, spec)
    out = config.getoption("memeval_out")
    if out:
        run_dir = (config.invocation_params.dir / Path(out).expanduser()).resolve()
    else:
        run_dir = config.rootpath / config.getini("memeval_out") / run_dir_name(name, overrides)
        if shard is not None:
            run_dir = run_dir / shard_dir_name(*shard)
    return EpisodeState(
        profile=profile,
        spec=spec,
        run_dir=run_dir,
        overrides=overrides,
        fingerprints=_fingerprints(profile, conversion, env),
        env=env,
        provide_items=covers_project(config),
        shard=shard,
        decode_path=_decode_path(config),
    )


def _decode_path(config: pytest.Config) -> str:
    """``--memeval-decode`` or the ``memeval_decode`` ini (a usage error when neither path)."""
    decode = str(config.getoption("memeval_decode") or config.getini("memeval_decode"))
    if decode not in DECODE_PATHS:
        raise pytest.UsageError(f"memeval_decode must be one of {DECODE_PATHS}, got {decode!r}")
    return decode


def _select_shard(config: pytest.Config, spec: EnvSpec) -> tuple[int, int] | None:
    """``--memeval-shard K/N`` over the profile's episodes (a usage error when malformed or
    when shard K would be empty)."""
    text = config.getoption("memeval_shard")
    if not text:
        return None
    try:
        _ids, shard = select_shard([episode_id(spec, seed) for seed in spec.seeds], text)
    except ShardError as exc:
        raise pytest.UsageError(str(exc).replace("scenario(s)", "episode(s)")) from None
    return shard


def _shard_pair(value: object) -> tuple[int, int] | None:
    """The controller's ``(K, N)`` as a worker receives it (a list), or ``None``."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def _say(line: str) -> None:
    print(line, flush=True)


def item_seed(item: pytest.Item) -> int | None:
    """The seed an episode item runs (``None``: not an episode item)."""
    callspec = getattr(item, "callspec", None)
    seed = callspec.params.get(SEED_FIXTURE) if callspec is not None else None
    return seed if isinstance(seed, int) else None


def episode_items(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items parametrized over the episodes' seeds."""
    return [i for i in items if SEED_FIXTURE in getattr(i, "fixturenames", ())]


def provide_episode_items(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item], module: ModuleType
) -> None:
    """Add ``memeval::test_episode[<id>]`` from ``module`` (the public
    :mod:`pytest_memeval.episodes`, handed in by plugin.py) where no collected module provides
    episode items, in a run that collects the whole project (as the scenario items). A run
    given only modules of scenario items (``pytest contracts/test_eval.py --ckpt <closed-loop
    profile>``) would evaluate nothing: a usage error says so, before any environment starts."""
    state = config.stash.get(EPISODE_STATE_KEY, None)
    if state is None or episode_items(items):
        return
    if state.provide_items:
        items.extend(collect_module_object(session, module, name=PROVIDED, path=config.rootpath))
        return
    if not is_worker(config):  # under xdist the controller says it, from the node ids
        check_not_only_scenario_items(state, [item.nodeid for item in items])


def check_not_only_scenario_items(state: EpisodeState, nodeids: Sequence[str]) -> None:
    """Raise the usage error of a closed-loop run whose collection (``nodeids``) holds
    scenario items (skipped: they need a benchmark profile) and no episode item."""
    episodes = IdMap(state.ids())
    if any(episodes.scenario_of(nodeid) is not None for nodeid in nodeids):
        return
    names = [split_item_name(nodeid) for nodeid in nodeids]
    if any(name is not None and name[1] == NO_PROFILE_ID for name in names):
        raise pytest.UsageError(_scenario_items_only(state.profile.name))


def _scenario_items_only(name: str) -> str:
    return (
        f"memeval: --ckpt {name} is a closed-loop profile (its table has 'env'): its eval "
        "items are episodes, but the paths given collect only scenario items "
        "(test_final_query, test_turns), which need a benchmark profile. Run `pytest --ckpt "
        f"{name}` without a path (the plugin provides memeval::test_episode[...] when the "
        "whole project is collected), or give a module that imports "
        "`from pytest_memeval.episodes import test_episode`."
    )


def parametrize_episodes(metafunc: pytest.Metafunc) -> None:
    """Parametrize an episode item over the profile's seeds (skipped without one)."""
    if SEED_FIXTURE not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(EPISODE_STATE_KEY, None)
    if state is None:
        reason = "no closed-loop profile: episode items need --ckpt NAME whose profile has 'env'"
        skip = pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-env")
        metafunc.parametrize(SEED_FIXTURE, [skip], indirect=True)
        return
    mark = pytest.mark.memeval_eval
    params = [
        pytest.param(seed, id=param_id(episode_id(state.spec, seed)), marks=mark)
        for seed in state.run_seeds()
    ]
    metafunc.parametrize(SEED_FIXTURE, params, indirect=True)
