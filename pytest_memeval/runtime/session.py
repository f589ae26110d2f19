"""The run's state, built once at configure: ``--ckpt`` profile (+ command-line overrides) ->
benchmark (file or builder hook) -> scope (shard) -> fingerprints, run directory, decode path.

On the controller (or a single process) everything is resolved here and checked before any
item runs (checkpoint files, replay file, preflight); an xdist worker receives the
controller's results as plain data in ``workerinput`` and rebuilds only the scenarios.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pytest_memeval.core.benchmark import Benchmark, BenchmarkError
from pytest_memeval.core.builders import load_profile_benchmark
from pytest_memeval.core.cache import resolve_cache_dir
from pytest_memeval.core.history import (
    HISTORY_MODEL,
    HISTORY_TRUTH,
    RUN_DIR_SUFFIX,
    history_name,
)
from pytest_memeval.core.profiles import (
    Profile,
    ProfileError,
    apply_overrides,
    profile_from_plain,
    resolve_profile,
)
from pytest_memeval.core.sharding import ShardError, select_shard, shard_dir_name
from pytest_memeval.decode.replay import (
    check_replay_history,
    load_replay_source,
    source_fingerprints,
)
from pytest_memeval.model.checks import (
    check_profile_checkpoint,
    fingerprint_dir,
)
from pytest_memeval.model.gguf import GgufConversion, prepare_profile
from pytest_memeval.model.preflight import OverlongReport, preflight
from pytest_memeval.runtime.eval_items import covers_project
from pytest_memeval.runtime.state import MemevalState, MemevalWorkerInput, workerinput

__all__ = [
    "DECODE_PATHS",
    "build_state",
    "cache_dir",
    "controller_profile",
    "decoding_fingerprint",
    "decoding_settings",
    "load_benchmark",
    "profiles_file",
    "run_dir_name",
    "run_preflight",
]

DECODE_PATHS = ("fast", "reference")


def profiles_file(config: pytest.Config) -> Path:
    value = config.getini("memeval_profiles")
    if value:
        return (config.rootpath / str(value)).resolve()
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def load_benchmark(config: pytest.Config, profile: Profile) -> Benchmark:
    """The profile's scenarios, from its JSONL file or its builder hook."""

    def build(
        builder: str, options: Mapping[str, Any], rootdir: Path
    ) -> Iterable[Mapping[str, Any]] | None:
        records: Iterable[Mapping[str, Any]] | None = config.hook.pytest_memeval_build_benchmark(
            config=config, builder=builder, options=options, rootdir=rootdir
        )
        return records

    return load_profile_benchmark(profile, build)


def decoding_fingerprint(settings: Mapping[str, Any]) -> str:
    """Hash of the decoding settings that can change predictions (not the decode path)."""
    blob = json.dumps(dict(settings), sort_keys=True).encode("utf-8")
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def decoding_settings(profile: Profile, history: str) -> dict[str, Any]:
    """What the decoding fingerprint hashes: the generation settings, and the history when it
    is the model's own (a teacher-forced run's fingerprint is what it always was)."""
    settings = profile.generation.as_dict()
    if history != HISTORY_TRUTH:
        settings["history"] = history
    return settings


def _fingerprints(
    profile: Profile, benchmark: Benchmark, conversion: GgufConversion | None, history: str
) -> dict[str, str | None]:
    if profile.kind == "replay":
        fps = source_fingerprints(profile)
        return {**fps, "benchmark": benchmark.fingerprint}
    fps = {
        "benchmark": benchmark.fingerprint,
        # A GGUF model: the file's own sha256, what `sha256sum FILE` prints.
        "model": conversion.fingerprint if conversion else fingerprint_dir(profile.model_dir),
        "adapter": fingerprint_dir(profile.adapter) if profile.adapter else None,
        "decoding": decoding_fingerprint(decoding_settings(profile, history)),
    }
    if profile.tokenizer is not None:
        fps["tokenizer"] = fingerprint_dir(profile.tokenizer)
    return fps


def _cli_path(config: pytest.Config, value: str | None) -> Path | None:
    """A path given on the command line, relative to where pytest was started."""
    if not value:
        return None
    return (config.invocation_params.dir / Path(value).expanduser()).resolve()


def _say(line: str) -> None:
    """A line for the user before the run starts (configure time: no terminal reporter)."""
    print(line, file=sys.stderr, flush=True)


def cache_dir(config: pytest.Config) -> Path:
    """The cache directory (core/cache.py): ``--memeval-cache-dir`` (relative to where
    pytest was started), ini ``memeval_cache_dir`` (relative to the rootdir), else the
    environment's choice."""
    explicit = _cli_path(config, config.getoption("memeval_cache_dir"))
    ini = config.getini("memeval_cache_dir")
    if explicit is None and ini:
        explicit = (config.rootpath / Path(str(ini)).expanduser()).resolve()
    return resolve_cache_dir(explicit)


def run_dir_name(
    name: str, overrides: Mapping[str, Mapping[str, str | None]], history: str = HISTORY_TRUTH
) -> str:
    """The run directory name of profile ``name`` with command-line ``overrides``.

    ``oracle`` without overrides; ``oracle@checkpoint-500-1a2b3c4d`` with ``--memeval-adapter
    .../checkpoint-500`` (the hash of the absolute path keeps ``run-a/checkpoint-500`` and
    ``run-b/checkpoint-500`` apart), ``oracle@model-base2-...@dtype-bfloat16`` and so on; a
    free-running run (``history`` ``model``) ends with ``@history-model``, beside the
    teacher-forced run of the same checkpoint.
    """
    parts = [name]
    for key in ("model", "adapter"):
        if key in overrides:
            value = str(overrides[key]["value"])
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:8]
            label = Path(value).name or "root"
            parts.append(f"{'model-' if key == 'model' else ''}{label}-{digest}")
    for key in sorted(k for k in overrides if k.startswith("generation.")):
        value = str(overrides[key]["value"])
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)
        parts.append(f"{key.split('.', 1)[1]}-{safe}")
    return "@".join(parts) + (RUN_DIR_SUFFIX if history == HISTORY_MODEL else "")


def controller_profile(
    config: pytest.Config, name: str
) -> tuple[Profile, dict[str, dict[str, str | None]]]:
    """Resolve ``--ckpt NAME`` from the profiles file and apply the command-line overrides.

    Done once, in the controller (or the single process): xdist workers receive the result
    in ``workerinput`` and never look for a profiles file themselves.
    """
    profile = resolve_profile(name, profiles_file(config))
    return apply_overrides(
        profile,
        model=_cli_path(config, config.getoption("memeval_model")),
        adapter=_cli_path(config, config.getoption("memeval_adapter")),
        settings=list(config.getoption("memeval_set") or []),
    )


class _Checkpoint(NamedTuple):
    """The profile a run evaluates, after the command line's overrides (``overrides``: what
    they changed), and a GGUF file's conversion when there was one."""

    profile: Profile
    overrides: dict[str, dict[str, str | None]]
    conversion: GgufConversion | None


class _CacheUse(NamedTuple):
    """The cache directory, the run's id, and whether the calibration is measured again."""

    cache_dir: Path
    run_id: str
    recalibrate: bool


def build_state(config: pytest.Config, name: str) -> MemevalState:
    """The run's state: on the controller (or the single process) resolved from the command
    line, the ini and the profiles file; on an xdist worker taken from the controller's
    ``workerinput``."""
    wi = workerinput(config)
    profile, overrides, conversion = _checkpoint(config, name, wi)
    benchmark = load_benchmark(config, profile)
    scope_ids, shard = benchmark.ids, None
    if config.getoption("memeval_shard"):
        try:
            scope_ids, shard = select_shard(benchmark.ids, config.getoption("memeval_shard"))
        except ShardError as exc:
            raise pytest.UsageError(str(exc)) from None
    replay_source = None
    if profile.kind == "replay":
        # The whole file against the benchmark, once, before any item: a bad file is one
        # usage error naming file, line, scenario and field, not an error per item.
        assert profile.predictions is not None
        replay_source = load_replay_source(profile.predictions, benchmark, scope_ids)
    history = _history(config)
    if replay_source is not None:
        check_replay_history(replay_source, history)
    run_dir = _run_dir(config, wi, run_dir_name(name, overrides, history), shard)
    decode = _decode_path(config, wi)
    if wi is not None and wi.get("memeval_benchmark_fingerprint") not in (
        None,
        benchmark.fingerprint,
    ):
        raise BenchmarkError(
            f"{benchmark.source}: this worker built different scenarios than the controller "
            "(a builder is not deterministic?)"
        )
    overlong: dict[str, dict[str, int]] = {}
    if profile.kind == "model" and wi is None:
        # Once, on the controller, before any item runs or any worker loads weights.
        overlong = run_preflight(config, profile, benchmark, scope_ids)
    elif wi is not None:
        overlong = dict(wi.get("memeval_overlong", {}))
    fingerprints: dict[str, str | None] = (
        dict(wi.get("memeval_fingerprints") or {"benchmark": benchmark.fingerprint})
        if wi is not None
        else _fingerprints(profile, benchmark, conversion, history)
    )
    cache = _cache_use(config, wi)
    return MemevalState(
        profile=profile,
        benchmark=benchmark,
        scope_ids=scope_ids,
        run_dir=run_dir,
        decode_path="replay" if profile.kind == "replay" else decode,
        fingerprints=fingerprints,
        shard=shard,
        overrides=overrides,
        overlong=overlong,
        replay_source=replay_source,
        gguf=conversion.describe() if conversion is not None else None,
        history=history,
        cache_dir=cache.cache_dir,
        run_id=cache.run_id,
        recalibrate=cache.recalibrate,
        provide_items=(
            bool(wi.get("memeval_provide_items", False))
            if wi is not None
            else covers_project(config)
        ),
    )


def _checkpoint(config: pytest.Config, name: str, wi: MemevalWorkerInput | None) -> _Checkpoint:
    """The profile: on a worker, exactly the one the controller resolved; else resolved and
    overridden here, a GGUF model converted and the checkpoint's files checked."""
    handed = wi.get("memeval_profile") if wi is not None else None
    if wi is not None and handed is not None:
        # The controller resolved the profile (and its overrides) once: use exactly that.
        return _Checkpoint(profile_from_plain(handed), dict(wi.get("memeval_overrides", {})), None)
    profile, overrides = controller_profile(config, name)
    conversion: GgufConversion | None = None
    if profile.kind == "model":
        # A GGUF model is converted here, once, before any worker starts: the workers
        # get the converted directory in the profile they are handed.
        profile, conversion = prepare_profile(profile, cache_dir(config), _say)
        check_profile_checkpoint(profile)
    elif profile.predictions is not None and not profile.predictions.is_file():
        raise ProfileError(
            f"{profile.source}: [tool.memeval.ckpt.{name}]: predictions file not found: "
            f"{profile.predictions}"
        )
    return _Checkpoint(profile, overrides, conversion)


def _run_dir(
    config: pytest.Config,
    wi: MemevalWorkerInput | None,
    dir_name: str,
    shard: tuple[int, int] | None,
) -> Path:
    """The run directory: the controller's on a worker, else ``--memeval-out``, else
    ``dir_name`` (:func:`run_dir_name`) under the ``memeval_out`` ini (a shard's below it)."""
    out = config.getoption("memeval_out")
    if wi is not None and wi.get("memeval_run_dir"):
        return Path(wi["memeval_run_dir"])
    if out:
        return _cli_path(config, out) or Path(out).resolve()
    run_dir: Path = config.rootpath / config.getini("memeval_out") / dir_name
    return run_dir / shard_dir_name(*shard) if shard is not None else run_dir


def _decode_path(config: pytest.Config, wi: MemevalWorkerInput | None) -> str:
    """The decode path: the controller's on a worker, else ``--memeval-decode`` or the ini."""
    if wi is not None and wi.get("memeval_decode_path"):
        decode = str(wi["memeval_decode_path"])
    else:
        decode = config.getoption("memeval_decode") or config.getini("memeval_decode")
    if decode not in (*DECODE_PATHS, "replay"):
        raise pytest.UsageError(f"memeval_decode must be one of {DECODE_PATHS}, got {decode!r}")
    return str(decode)


def _cache_use(config: pytest.Config, wi: MemevalWorkerInput | None) -> _CacheUse:
    """The controller's cache directory, run id and recalibration on a worker; else the
    resolved cache directory, a new run id, and ``--memeval-recalibrate`` or the ini."""
    if wi is not None and wi.get("memeval_cache_dir"):
        return _CacheUse(
            Path(wi["memeval_cache_dir"]),
            str(wi.get("memeval_run_id", "")),
            bool(wi.get("memeval_recalibrate", False)),
        )
    return _CacheUse(cache_dir(config), uuid.uuid4().hex, recalibrate_requested(config))


def recalibrate_requested(config: pytest.Config) -> bool:
    """``--memeval-recalibrate``, else the ``memeval_recalibrate`` ini value."""
    return bool(config.getoption("memeval_recalibrate") or config.getini("memeval_recalibrate"))


def _history(config: pytest.Config) -> str:
    """``--memeval-history``, else the ``memeval_history`` ini value; on an xdist worker, the
    controller's (read once)."""
    wi = workerinput(config)
    if wi is not None and wi.get("memeval_history"):
        return str(wi["memeval_history"])
    value = config.getoption("memeval_history") or config.getini("memeval_history")
    try:
        return history_name(str(value).strip(), "memeval_history")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def run_preflight(
    config: pytest.Config, profile: Profile, benchmark: Benchmark, scope_ids: list[str]
) -> dict[str, dict[str, int]]:
    """Template errors and over-long scenarios, before the run
    (:mod:`pytest_memeval.model.preflight`); returns the over-long scenarios the user allowed
    (id -> tokens, limit)."""
    allow = config.getoption("memeval_allow_overlong")
    if allow is None:
        allow = bool(config.getini("memeval_allow_overlong"))
    by_id = benchmark.by_id()
    result = preflight(
        profile.model_dir,
        [by_id[sid] for sid in scope_ids],
        max_new_tokens=profile.generation.max_new_tokens,
        allow_overlong=bool(allow),
        tokenizer_dir=profile.tokenizer,
    )
    if result.overlong:
        config.pluginmanager.register(OverlongReport(result), "memeval-overlong")
    return result.overlong_records()
