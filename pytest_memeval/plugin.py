"""pytest-memeval's pytest entry point (``pytest11``): options, configuration, collection.

Data flow: the profile picked by ``--ckpt`` names a benchmark (file or builder) -> scenario
records (:mod:`.benchmark`) -> one pair of items per scenario -> the worker's decoder
(:mod:`.worker`) -> a record on each test report -> the controller (:mod:`.controller`)
aggregates and writes the run directory.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import hookspecs
from .benchmark import Benchmark, BenchmarkError, from_records, load_jsonl
from .ids import param_id
from .model import CheckpointError, check_adapter_dir, check_model_dir, fingerprint_dir
from .preflight import PreflightError
from .profiles import (
    Profile,
    ProfileError,
    apply_overrides,
    profile_from_plain,
    resolve_profile,
)
from .state import STATE_KEY, MemevalState, is_worker, workerinput

if TYPE_CHECKING:
    from .decode import Decoder

DECODE_PATHS = ("fast", "reference")
#: ``MemevalState.extra`` key of a replay profile's checked predictions (a ReplaySource).
REPLAY_SOURCE = "replay_source"

# CI gates / known failures, and the pytest-html integration (active only with pytest-html),
# are plugin modules of their own, loaded with this one.
pytest_plugins = [
    "pytest_memeval.gate",
    # Wrong answers shown one line each by default (pytest's -v, --tb, -rA give full reports).
    "pytest_memeval.failures",
    "pytest_memeval.html_extras",
    # `--memeval-out DIR` written with a space: keep pytest's rootdir/config file right.
    "pytest_memeval.cmdline",
    # One device per xdist worker; its early hooks bind before anything touches CUDA.
    "pytest_memeval.device_binding",
    # Byte guards: parametrizes @pytest.mark.memeval_guard items (model-free, no --ckpt).
    "pytest_memeval.guard_tests",
    # --memeval-progress / memeval_progress: progress lines while a run goes (controller).
    "pytest_memeval.progress",
]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval", "scene-memory evaluation (pytest-memeval)")
    group.addoption(
        "--ckpt",
        dest="memeval_ckpt",
        metavar="NAME",
        default=None,
        help="checkpoint profile to evaluate ([tool.memeval.ckpt.NAME]); without it the "
        "eval items are skipped",
    )
    group.addoption(
        "--memeval-out",
        dest="memeval_out",
        metavar="DIR",
        default=None,
        help="run directory (default: <memeval_out ini>/<ckpt>, i.e. runs/<ckpt>)",
    )
    group.addoption(
        "--memeval-decode",
        dest="memeval_decode",
        choices=DECODE_PATHS,
        default=None,
        help="decode path: 'fast' (one teacher-forced pass per scenario, generate only where "
        "needed) or 'reference' (greedy generate per turn). Default: memeval_decode ini.",
    )
    group.addoption(
        "--memeval-resume",
        dest="memeval_resume",
        action="store_true",
        default=False,
        help="continue the run in the run directory: evaluate only the scenarios its journal "
        "lacks (refused unless benchmark, model, adapter and decoding fingerprints match)",
    )
    group.addoption(
        "--memeval-gpus",
        dest="memeval_gpus",
        metavar="IDS",
        default=None,
        help="GPUs for the xdist workers, one each, e.g. 0,1,2,3 (physical ids, as nvidia-smi "
        "numbers them; 'cpu' for none). Default: CUDA_VISIBLE_DEVICES if set, else every GPU "
        "nvidia-smi lists. Devices are bound when --ckpt or this option is given.",
    )
    group.addoption(
        "--memeval-workers-per-gpu",
        dest="memeval_workers_per_gpu",
        metavar="K",
        type=int,
        default=1,
        help="allow K xdist workers on each GPU (default 1: more workers than GPUs is an error)",
    )
    group.addoption(
        "--memeval-gpus-per-worker",
        dest="memeval_gpus_per_worker",
        metavar="K",
        type=int,
        default=1,
        help="give each xdist worker K GPUs and load the model across them (device_map, for "
        "models larger than one GPU); workers = GPUs / K, more is an error (default 1)",
    )
    group.addoption(
        "--memeval-shard",
        dest="memeval_shard",
        metavar="K/N",
        default=None,
        help="evaluate only shard K of N (1-based; contiguous slices in benchmark order, sizes "
        "differing by at most 1); the run goes to runs/<ckpt>/shard-K-of-N unless "
        "--memeval-out is given. Merge the N shard runs with 'memeval merge'.",
    )
    group.addoption(
        "--memeval-model",
        dest="memeval_model",
        metavar="DIR",
        default=None,
        help="evaluate this base-model directory instead of the profile's 'model' (sweeps); "
        "the run directory and the model fingerprint follow it",
    )
    group.addoption(
        "--memeval-adapter",
        dest="memeval_adapter",
        metavar="DIR",
        default=None,
        help="evaluate this PEFT adapter directory instead of the profile's 'adapter' (e.g. "
        "each checkpoint-N of a training run); the run goes to runs/<ckpt>@<adapter>-<hash>",
    )
    group.addoption(
        "--memeval-set",
        dest="memeval_set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one generation setting of the profile, e.g. generation.dtype=bfloat16 "
        "(repeatable; keys: generation.max_new_tokens, generation.dtype, "
        "generation.attn_implementation)",
    )
    group.addoption(
        "--memeval-allow-overlong",
        dest="memeval_allow_overlong",
        action="store_true",
        default=None,
        help="evaluate scenarios longer than the model's context (max_position_embeddings, "
        "the tokenizer's model_max_length) instead of refusing the run; they are named before "
        "the run and flagged in their records and the summary. Default: "
        "memeval_allow_overlong ini.",
    )
    parser.addini(
        "memeval_profiles",
        "TOML file holding [tool.memeval.ckpt.*] profiles (default: pyproject.toml in rootdir)",
        default=None,
    )
    parser.addini("memeval_out", "parent directory of run directories", default="runs")
    parser.addini("memeval_decode", "default decode path (fast or reference)", default="fast")
    parser.addini(
        "memeval_allow_overlong",
        "evaluate (and flag) scenarios longer than the model's context instead of refusing",
        type="bool",
        default=False,
    )


def profiles_file(config: pytest.Config) -> Path:
    value = config.getini("memeval_profiles")
    if value:
        return (config.rootpath / str(value)).resolve()
    if config.inipath is not None and config.inipath.name == "pyproject.toml":
        return config.inipath
    return config.rootpath / "pyproject.toml"


def load_benchmark(config: pytest.Config, profile: Profile) -> Benchmark:
    """The profile's scenarios, from its JSONL file or its builder hook."""
    spec = profile.benchmark
    if spec.path is not None:
        return load_jsonl(spec.path)
    assert spec.builder is not None
    records: Iterable[Mapping[str, Any]] | None = config.hook.pytest_memeval_build_benchmark(
        config=config, builder=spec.builder, options=spec.options, rootdir=profile.root
    )
    if records is None:
        raise BenchmarkError(
            f"{profile.source}: [tool.memeval.ckpt.{profile.name}]: no plugin implements "
            f"benchmark builder {spec.builder!r}"
        )
    return from_records(records, f"builder {spec.builder!r} ({profile.name})")


@pytest.hookimpl(trylast=True)
def pytest_memeval_build_benchmark(
    builder: str, options: Mapping[str, Any], rootdir: Path
) -> Iterable[Mapping[str, Any]] | None:
    """The bundled builders (``builders.BUILDERS``, e.g. ``scene_memory``)."""
    from .builders import BUILDERS

    build = BUILDERS.get(builder)
    if build is None:
        return None
    try:
        return list(build(options, rootdir))
    except BenchmarkError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        # The builder names the file and line; keep its message, tag the builder.
        raise BenchmarkError(f"builder {builder!r}: {exc}") from None


def decoding_fingerprint(settings: Mapping[str, Any]) -> str:
    """Hash of the decoding settings that can change predictions (not the decode path)."""
    blob = json.dumps(dict(settings), sort_keys=True).encode("utf-8")
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _fingerprints(profile: Profile, benchmark: Benchmark) -> dict[str, str | None]:
    if profile.kind == "replay":
        from .decode.replay import source_fingerprints

        fps = source_fingerprints(profile)
        return {**fps, "benchmark": benchmark.fingerprint}
    assert profile.model is not None
    return {
        "benchmark": benchmark.fingerprint,
        "model": fingerprint_dir(profile.model),
        "adapter": fingerprint_dir(profile.adapter) if profile.adapter else None,
        "decoding": decoding_fingerprint(profile.generation.as_dict()),
    }


def _cli_path(config: pytest.Config, value: str | None) -> Path | None:
    """A path given on the command line, relative to where pytest was started."""
    if not value:
        return None
    return (config.invocation_params.dir / Path(value).expanduser()).resolve()


def run_dir_name(name: str, overrides: Mapping[str, Mapping[str, str | None]]) -> str:
    """The run directory name of profile ``name`` with command-line ``overrides``.

    ``oracle`` without overrides; ``oracle@checkpoint-500-1a2b3c4d`` with ``--memeval-adapter
    .../checkpoint-500`` (the hash of the absolute path keeps ``run-a/checkpoint-500`` and
    ``run-b/checkpoint-500`` apart), ``oracle@model-base2-...@dtype-bfloat16`` and so on.
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
    return "@".join(parts)


def _controller_profile(
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


def _build_state(config: pytest.Config, name: str) -> MemevalState:
    wi = workerinput(config)
    handed = wi.get("memeval_profile") if wi is not None else None
    if wi is not None and handed is not None:
        # The controller resolved the profile (and its overrides) once: use exactly that.
        profile = profile_from_plain(handed)
        overrides = dict(wi.get("memeval_overrides", {}))
    else:
        profile, overrides = _controller_profile(config, name)
        if profile.kind == "model":
            assert profile.model is not None
            check_model_dir(profile.model)
            if profile.adapter is not None:
                check_adapter_dir(profile.adapter)
                from .checkpoint_checks import check_adapter_fits

                check_adapter_fits(profile.model, profile.adapter)
        elif profile.predictions is not None and not profile.predictions.is_file():
            raise ProfileError(
                f"{profile.source}: [tool.memeval.ckpt.{name}]: predictions file not found: "
                f"{profile.predictions}"
            )
    benchmark = load_benchmark(config, profile)
    scope_ids, shard = benchmark.ids, None
    if config.getoption("memeval_shard"):
        from .sharding import ShardError, select_shard, shard_dir_name

        try:
            scope_ids, shard = select_shard(benchmark.ids, config.getoption("memeval_shard"))
        except ShardError as exc:
            raise pytest.UsageError(str(exc)) from None
    extra: dict[str, Any] = {}
    if profile.kind == "replay":
        from .decode.replay import load_replay_source

        # The whole file against the benchmark, once, before any item: a bad file is one
        # usage error naming file, line, scenario and field, not an error per item.
        assert profile.predictions is not None
        extra[REPLAY_SOURCE] = load_replay_source(profile.predictions, benchmark, scope_ids)
    out = config.getoption("memeval_out")
    if wi is not None and wi.get("memeval_run_dir"):
        run_dir = Path(wi["memeval_run_dir"])
    elif out:
        run_dir = _cli_path(config, out) or Path(out).resolve()
    else:
        run_dir = config.rootpath / config.getini("memeval_out") / run_dir_name(name, overrides)
        if shard is not None:
            run_dir = run_dir / shard_dir_name(*shard)
    if wi is not None and wi.get("memeval_decode_path"):
        decode = str(wi["memeval_decode_path"])
    else:
        decode = config.getoption("memeval_decode") or config.getini("memeval_decode")
    if decode not in (*DECODE_PATHS, "replay"):
        raise pytest.UsageError(f"memeval_decode must be one of {DECODE_PATHS}, got {decode!r}")
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
        overlong = _preflight(config, profile, benchmark, scope_ids)
    elif wi is not None:
        overlong = dict(wi.get("memeval_overlong", {}))
    fingerprints: dict[str, str | None] = (
        {"benchmark": benchmark.fingerprint}
        if wi is not None
        else _fingerprints(profile, benchmark)
    )
    if overlong:
        extra["overlong"] = overlong
    state = MemevalState(
        profile=profile,
        benchmark=benchmark,
        scope_ids=scope_ids,
        run_dir=run_dir,
        decode_path="replay" if profile.kind == "replay" else str(decode),
        fingerprints=fingerprints,
        shard=shard,
        extra=extra,
    )
    state.extra["overrides"] = overrides
    return state


def _preflight(
    config: pytest.Config, profile: Profile, benchmark: Benchmark, scope_ids: list[str]
) -> dict[str, dict[str, int]]:
    """Template errors and over-long scenarios, before the run (:mod:`.preflight`); returns
    the over-long scenarios the user allowed (id -> tokens, limit)."""
    from .preflight import OverlongReport, preflight

    assert profile.model is not None
    allow = config.getoption("memeval_allow_overlong")
    if allow is None:
        allow = bool(config.getini("memeval_allow_overlong"))
    by_id = benchmark.by_id()
    result = preflight(
        profile.model,
        [by_id[sid] for sid in scope_ids],
        max_new_tokens=profile.generation.max_new_tokens,
        allow_overlong=bool(allow),
    )
    if result.overlong:
        config.pluginmanager.register(OverlongReport(result), "memeval-overlong")
    return result.overlong_records()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "memeval_eval: an evaluation item of pytest-memeval (one per scenario and check)"
    )
    name = config.getoption("memeval_ckpt")
    if not name:
        return
    wi = workerinput(config)
    if wi is not None and "memeval_rootdir" in wi:
        from .cmdline import check_worker_setup

        check_worker_setup(config, wi["memeval_rootdir"], wi.get("memeval_inifile"))
    try:
        state = _build_state(config, name)
    except (ProfileError, BenchmarkError, CheckpointError, PreflightError) as exc:
        raise pytest.UsageError(str(exc)) from None
    state.extra["started"] = time.time()
    config.stash[STATE_KEY] = state
    from .worker import MemevalWorker

    worker = MemevalWorker(config, state)
    config.pluginmanager.register(worker, "memeval-worker")
    from .startup import EarlyLoad, StartupWatch

    # The model is loaded before any item runs; a failure stops the run once (startup.py).
    config.pluginmanager.register(EarlyLoad(config, worker, state), "memeval-early-load")
    if not is_worker(config) and config.pluginmanager.has_plugin("xdist"):
        config.pluginmanager.register(StartupWatch(state), "memeval-startup-watch")
    from .resume import register_worker_resume

    register_worker_resume(config)
    if not is_worker(config):
        from .controller import MemevalController

        config.pluginmanager.register(MemevalController(config, state), "memeval-controller")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    from .cmdline import setup_note

    note = setup_note(config)
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return ([note] if note else []) + ["memeval: no --ckpt given, eval items will be skipped"]
    p = state.profile
    lines = [note] if note else []
    lines.append(
        f"memeval: ckpt {p.name} ({p.kind}), {len(state.scope_ids)} scenarios from "
        f"{p.benchmark.describe()}, decode {state.decode_path}"
    )
    if p.kind == "model":
        lines.append(f"memeval: model {p.model}, adapter {p.adapter or 'none'}")
    overridden = describe_overrides(state.extra.get("overrides", {}))
    if overridden:
        lines.append(f"memeval: overridden on the command line: {overridden}")
    if state.shard is not None:
        from .sharding import describe_shard

        lines.append(describe_shard(state.benchmark.ids, state.shard))
    lines.append(f"memeval: run directory {state.run_dir}")
    return lines


def describe_overrides(overrides: Mapping[str, Mapping[str, str | None]]) -> str:
    """``adapter /x/checkpoint-500 (profile: /y/oracle), generation.dtype bfloat16 (...)``."""
    return ", ".join(
        f"{key} {part.get('value')} (profile: {part.get('profile') or 'none'})"
        for key, part in overrides.items()
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "memeval_scenario" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE_KEY, None)
    if state is None:
        reason = (
            "no --ckpt given: eval items need a checkpoint profile "
            "(e.g. pytest --ckpt oracle; profiles are [tool.memeval.ckpt.*] tables)"
        )
        metafunc.parametrize(
            "memeval_scenario",
            [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-ckpt")],
            indirect=True,
        )
        return
    # The mark goes on each param: a mark added to the definition does not reach the items.
    eval_mark = pytest.mark.memeval_eval
    # The id is ids.param_id(sid): safe in node ids, -k, --deselect, --lf and JUnit for
    # any scenario id (pytest would escape non-ASCII; "::" and brackets break node ids).
    params = [pytest.param(sid, id=param_id(sid), marks=eval_mark) for sid in state.scope_ids]
    metafunc.parametrize("memeval_scenario", params, indirect=True)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Let ``-k`` match an eval item by its scenario id as well as by its pytest id.

    ``-k`` matches substrings of an item's names and extra keywords; the pytest id of an odd
    scenario id is a slug (``cafe_1-<hash>``), so the raw id is added too: ``-k café``
    selects ``café 1`` (``-k`` names cannot hold spaces, quotes or ``#``; see README).
    """
    from .worker import scenario_param

    sid = scenario_param(item)
    if sid is not None and sid != item.name:
        item.extra_keyword_matches.add(sid)


def default_decoder(config: pytest.Config, profile: Profile, path: str, device: str) -> Decoder:
    """Load the profile's checkpoint and build its decoder (the default make_decoder)."""
    if profile.kind == "replay":
        from .decode.replay import ReplayDecoder

        return ReplayDecoder(config.stash[STATE_KEY].extra[REPLAY_SOURCE])
    from .decode import make_model_decoder
    from .model import load_model

    assert profile.model is not None
    settings = profile.generation
    loaded = load_model(
        profile.model,
        profile.adapter,
        dtype=settings.dtype,
        attn_implementation=settings.attn_implementation,
        device=device,
    )
    return make_model_decoder(path, loaded, settings.max_new_tokens)


@pytest.hookimpl(trylast=True)
def pytest_memeval_make_decoder(
    config: pytest.Config, profile: Profile, path: str, device: str
) -> Decoder | None:
    return default_decoder(config, profile, path, device)


# Fixtures live in one module so a reader finds them by name.
from .fixtures import memeval_decoder, memeval_record, memeval_scenario  # noqa: E402

__all__ = ["memeval_decoder", "memeval_record", "memeval_scenario"]
