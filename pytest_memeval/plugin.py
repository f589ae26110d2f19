"""pytest-memeval's pytest entry point (``pytest11``): options, configuration, collection.

Data flow (docs/architecture.md): the profile picked by ``--ckpt`` names a benchmark (file or
builder) -> scenario records (:mod:`.core.benchmark`) -> one pair of items per scenario -> the
worker's decoder (:mod:`.runtime.worker`) -> a record on each test report -> the controller
(:mod:`.runtime.controller`) aggregates and writes the run directory. The run's state is built
in :mod:`.runtime.session`; this module only wires pytest's hooks to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_memeval import episodes, evaluation, hookspecs
from pytest_memeval.compat.pytest import collect_module_object
from pytest_memeval.core.benchmark import BenchmarkError
from pytest_memeval.core.builders import build_bundled
from pytest_memeval.core.history import HISTORIES, HISTORY_TRUTH, describe_history
from pytest_memeval.core.ids import param_id
from pytest_memeval.core.profiles import Profile, ProfileError, describe_overrides
from pytest_memeval.core.sharding import describe_shard
from pytest_memeval.decode import make_model_decoder
from pytest_memeval.decode.fast import CalibrationStore, weight_fingerprints
from pytest_memeval.decode.replay import ReplayDecoder
from pytest_memeval.model.checks import CheckpointError
from pytest_memeval.model.loading import load_profile_model
from pytest_memeval.model.preflight import PreflightError
from pytest_memeval.runtime.cmdline import check_worker_setup, setup_note
from pytest_memeval.runtime.controller import MemevalController, run_dir_line
from pytest_memeval.runtime.episodes import (
    CONTROLLER_NAME,
    EPISODE_STATE_KEY,
    WORKER_NAME,
    EpisodeController,
    EpisodeWorker,
    build_episode_state,
    deselect_resumed,
    memeval_episode,
    memeval_episode_seed,
    parametrize_episodes,
    provide_episode_items,
)
from pytest_memeval.runtime.eval_items import (
    NO_PROFILE_ID,
    PROVIDED,
    SCENARIO_FIXTURE,
    eval_item_count,
    scenario_param,
)

# The fixtures live in one module so a reader finds them by name; importing them here
# registers them with this plugin.
from pytest_memeval.runtime.fixtures import memeval_decoder, memeval_record, memeval_scenario
from pytest_memeval.runtime.resume import register_worker_resume
from pytest_memeval.runtime.session import DECODE_PATHS, build_state
from pytest_memeval.runtime.startup import EarlyLoad, StartupWatch
from pytest_memeval.runtime.state import STATE_KEY, is_worker, workerinput
from pytest_memeval.runtime.worker import MemevalWorker

if TYPE_CHECKING:
    from pytest_memeval.decode import Decoder


# Plugin modules of our own, loaded with this one, in this order (pytest registers each right
# after this module, so their hooks run in the order the tests and docs describe):
pytest_plugins = [
    # CI gates and known failures.
    "pytest_memeval.tools.gate.plugin",
    # Wrong answers shown one line each (pytest's -v, --tb, -rA give full reports).
    "pytest_memeval.runtime.failures",
    # The pytest-html integration (active only with pytest-html).
    "pytest_memeval.tools.report.plugin",
    # `--memeval-out DIR` written with a space: keep pytest's rootdir/config file right.
    "pytest_memeval.runtime.cmdline",
    # One device per xdist worker; its early hooks bind before anything touches CUDA.
    "pytest_memeval.runtime.device_binding",
    # Byte guards: parametrizes @pytest.mark.memeval_guard items (model-free, no --ckpt).
    "pytest_memeval.guards.items",
    # --memeval-progress / memeval_progress: progress lines while a run goes (controller).
    "pytest_memeval.runtime.progress",
    # --memeval-stall-timeout / memeval_stall_timeout: a run that stops moving is stopped.
    "pytest_memeval.runtime.stall",
    # The end of the session: pytest_memeval_run_finished, and its bundled implementations
    # (the Markdown step summary, JUnit properties, the MLflow logger when asked for).
    "pytest_memeval.tools.publish.finished",
    "pytest_memeval.tools.publish.step_summary",
    "pytest_memeval.tools.publish.junit",
    "pytest_memeval.tools.publish.tracking.mlflow",
]
# This module imports several of them before pytest reads ``pytest_plugins``; pytest would
# then warn once per module that it cannot rewrite their asserts. They hold no test code, so
# each says PYTEST_DONT_REWRITE in its docstring (pytest's documented opt-out), and
# tests/integration/test_plugin_warnings.py runs pytest with that warning as an error.


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@dataclass(frozen=True)
class _Option:
    """One command-line option of the ``memeval`` group: the keywords of ``addoption``
    (only those given: argparse's own defaults differ between an absent and a ``None``
    keyword, e.g. ``store_true``)."""

    flag: str
    dest: str
    help: str
    default: object = None
    metavar: str | None = None
    choices: Sequence[str] | None = None
    type: Callable[[str], object] | None = None
    action: str | None = None

    def keywords(self) -> dict[str, Any]:
        given = {
            "metavar": self.metavar,
            "choices": self.choices,
            "type": self.type,
            "action": self.action,
        }
        fixed = {"dest": self.dest, "default": self.default, "help": self.help}
        return fixed | {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class _Ini:
    """One ini key: the arguments of ``parser.addini`` (``type`` only where given)."""

    name: str
    help: str
    type: Literal["bool"] | None = None
    default: object = None


#: the options, in the order ``pytest --help`` lists them
_OPTIONS: tuple[_Option, ...] = (
    _Option(
        "--ckpt",
        dest="memeval_ckpt",
        metavar="NAME",
        default=None,
        help="checkpoint profile to evaluate ([tool.memeval.ckpt.NAME]); without it the "
        "eval items are skipped",
    ),
    _Option(
        "--memeval-out",
        dest="memeval_out",
        metavar="DIR",
        default=None,
        help="run directory (default: <memeval_out ini>/<ckpt>, i.e. runs/<ckpt>)",
    ),
    _Option(
        "--memeval-decode",
        dest="memeval_decode",
        choices=DECODE_PATHS,
        default=None,
        help="decode path: 'fast' (one teacher-forced pass per scenario, generate only where "
        "needed) or 'reference' (greedy generate per turn). Default: memeval_decode ini.",
    ),
    _Option(
        "--memeval-history",
        dest="memeval_history",
        choices=HISTORIES,
        default=None,
        help="what each turn's prompt holds as the earlier assistant messages: 'truth' (the "
        "benchmark's, teacher-forced) or 'model' (the model's own earlier predictions, "
        "free-running; the run goes to runs/<ckpt>@history-model). Default: memeval_history "
        "ini (truth).",
    ),
    _Option(
        "--memeval-resume",
        dest="memeval_resume",
        action="store_true",
        default=False,
        help="continue the run in the run directory: evaluate only the scenarios its journal "
        "lacks (refused unless benchmark, model, adapter and decoding fingerprints match)",
    ),
    _Option(
        "--memeval-gpus",
        dest="memeval_gpus",
        metavar="IDS",
        default=None,
        help="GPUs for the xdist workers, one each, e.g. 0,1,2,3 (physical ids, as nvidia-smi "
        "numbers them; 'cpu' for none). Default: CUDA_VISIBLE_DEVICES if set, else every GPU "
        "nvidia-smi lists. Devices are bound when --ckpt or this option is given.",
    ),
    _Option(
        "--memeval-workers-per-gpu",
        dest="memeval_workers_per_gpu",
        metavar="K",
        type=int,
        default=1,
        help="allow K xdist workers on each GPU (default 1: more workers than GPUs is an error)",
    ),
    _Option(
        "--memeval-gpus-per-worker",
        dest="memeval_gpus_per_worker",
        metavar="K",
        type=int,
        default=1,
        help="give each xdist worker K GPUs and load the model across them (device_map, for "
        "models larger than one GPU); workers = GPUs / K, more is an error (default 1)",
    ),
    _Option(
        "--memeval-shard",
        dest="memeval_shard",
        metavar="K/N",
        default=None,
        help="evaluate only shard K of N (1-based; contiguous slices in benchmark order, sizes "
        "differing by at most 1); the run goes to runs/<ckpt>/shard-K-of-N unless "
        "--memeval-out is given. Merge the N shard runs with 'memeval merge'.",
    ),
    _Option(
        "--memeval-model",
        dest="memeval_model",
        metavar="PATH",
        default=None,
        help="evaluate this base model (a transformers directory or a .gguf file) instead of "
        "the profile's 'model' (sweeps); the run directory and the model fingerprint follow it",
    ),
    _Option(
        "--memeval-cache-dir",
        dest="memeval_cache_dir",
        metavar="DIR",
        default=None,
        help="cache directory (GGUF conversions, downloads). Default: memeval_cache_dir ini, "
        "else $MEMEVAL_CACHE_DIR, $XDG_CACHE_HOME/pytest-memeval, ~/.cache/pytest-memeval",
    ),
    _Option(
        "--memeval-adapter",
        dest="memeval_adapter",
        metavar="DIR",
        default=None,
        help="evaluate this PEFT adapter directory instead of the profile's 'adapter' (e.g. "
        "each checkpoint-N of a training run); the run goes to runs/<ckpt>@<adapter>-<hash>",
    ),
    _Option(
        "--memeval-set",
        dest="memeval_set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one generation setting of the profile, e.g. generation.dtype=bfloat16 "
        "(repeatable; keys: generation.max_new_tokens, generation.dtype, "
        "generation.attn_implementation)",
    ),
    _Option(
        "--memeval-allow-overlong",
        dest="memeval_allow_overlong",
        action="store_true",
        default=None,
        help="evaluate scenarios longer than the model's context (max_position_embeddings, "
        "the tokenizer's model_max_length) instead of refusing the run; they are named before "
        "the run and flagged in their records and the summary. Default: "
        "memeval_allow_overlong ini.",
    ),
    _Option(
        "--memeval-slices",
        dest="memeval_slices",
        action="store_true",
        default=None,
        help="show m1 and m2 per tag (slice) of the benchmark in the memeval summary, with "
        "their intervals (metrics.json and the HTML report always have them). Default: "
        "memeval_slices ini.",
    ),
    _Option(
        "--memeval-recalibrate",
        dest="memeval_recalibrate",
        action="store_true",
        default=None,
        help="measure the fast path's calibration again instead of reusing the one stored in "
        "the cache directory (once per run: the run's other workers reuse what it measured); "
        "the new one replaces the stored one. Default: memeval_recalibrate ini.",
    ),
)
#: the ini keys, in the order ``pytest --help`` lists them
_INI_KEYS: tuple[_Ini, ...] = (
    _Ini(
        "memeval_profiles",
        "TOML file holding [tool.memeval.ckpt.*] profiles (default: pyproject.toml in rootdir)",
        default=None,
    ),
    _Ini("memeval_out", "parent directory of run directories", default="runs"),
    _Ini(
        "memeval_cache_dir",
        "cache directory (GGUF conversions, downloads), relative to the rootdir",
        default=None,
    ),
    _Ini("memeval_decode", "default decode path (fast or reference)", default="fast"),
    _Ini(
        "memeval_history",
        "default history of the prompts: truth (teacher-forced) or model (free-running)",
        default="truth",
    ),
    _Ini(
        "memeval_allow_overlong",
        "evaluate (and flag) scenarios longer than the model's context instead of refusing",
        type="bool",
        default=False,
    ),
    _Ini(
        "memeval_recalibrate",
        "measure the fast path's calibration again on every run (never reuse a stored one)",
        type="bool",
        default=False,
    ),
    _Ini(
        "memeval_slices",
        "show m1 and m2 per tag (slice) in the memeval summary",
        type="bool",
        default=False,
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval", "scene-memory evaluation (pytest-memeval)")
    for option in _OPTIONS:
        group.addoption(option.flag, **option.keywords())
    for ini in _INI_KEYS:
        if ini.type is None:
            parser.addini(ini.name, ini.help, default=ini.default)
        else:
            parser.addini(ini.name, ini.help, type=ini.type, default=ini.default)


@pytest.hookimpl(trylast=True)
def pytest_memeval_build_benchmark(
    builder: str, options: Mapping[str, Any], rootdir: Path
) -> Iterable[Mapping[str, Any]] | None:
    """The bundled builders (``builders.BUILDERS``, e.g. ``scene_memory``)."""
    return build_bundled(builder, options, rootdir)


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
        check_worker_setup(config, wi["memeval_rootdir"], wi.get("memeval_inifile"))
    if _configure_episodes(config, name):
        return
    try:
        state = build_state(config, name)
    except (ProfileError, BenchmarkError, CheckpointError, PreflightError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[STATE_KEY] = state
    worker = MemevalWorker(config, state)
    config.pluginmanager.register(worker, "memeval-worker")
    # The model is loaded before any item runs; a failure stops the run once (startup.py).
    config.pluginmanager.register(EarlyLoad(config, worker, state), "memeval-early-load")
    if not is_worker(config) and config.pluginmanager.has_plugin("xdist"):
        config.pluginmanager.register(StartupWatch(state), "memeval-startup-watch")
    register_worker_resume(config)
    if not is_worker(config):
        config.pluginmanager.register(MemevalController(config, state), "memeval-controller")


def _configure_episodes(config: pytest.Config, name: str) -> bool:
    """A closed-loop profile (one with ``env``): its items, worker and controller
    (runtime/episodes/items.py); ``False`` for a scenario profile."""
    episode_state = build_episode_state(config, name)
    if episode_state is None:
        return False
    config.stash[EPISODE_STATE_KEY] = episode_state
    config.pluginmanager.register(EpisodeWorker(config, episode_state), WORKER_NAME)
    if not is_worker(config):
        config.pluginmanager.register(EpisodeController(config, episode_state), CONTROLLER_NAME)
    return True


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    note = setup_note(config)
    state = config.stash.get(STATE_KEY, None)
    episode_state = config.stash.get(EPISODE_STATE_KEY, None)
    if episode_state is not None:
        spec = episode_state.spec
        shard = episode_state.shard
        of = f" (shard {shard[0]}/{shard[1]} of {len(spec.seeds)})" if shard else ""
        return [
            f"memeval: ckpt {episode_state.profile.name} (closed loop), "
            f"{len(episode_state.run_seeds())} episode(s){of} of {spec.backend} {spec.game} "
            f"({spec.params_text or 'default'}), fold {spec.fold}, max_steps {spec.max_steps}, "
            f"run directory {episode_state.run_dir}"
        ]
    if state is None:
        return ([note] if note else []) + ["memeval: no --ckpt given, eval items will be skipped"]
    p = state.profile
    lines = [note] if note else []
    lines.append(
        f"memeval: ckpt {p.name} ({p.kind}), {len(state.scope_ids)} scenarios from "
        f"{p.benchmark.describe()}, decode {state.decode_path}, history "
        f"{describe_history(state.history)}"
    )
    if p.kind == "model":
        tokenizer = f", tokenizer {p.tokenizer}" if p.tokenizer else ""
        lines.append(f"memeval: model {p.model}, adapter {p.adapter or 'none'}{tokenizer}")
        if state.gguf:
            lines.append(f"memeval: {state.gguf}")
    overridden = describe_overrides(state.overrides)
    if overridden:
        lines.append(f"memeval: overridden on the command line: {overridden}")
    if state.shard is not None:
        lines.append(describe_shard(state.benchmark.ids, state.shard))
    # The run directory is named once collection has selected eval items (run_dir_line):
    # a session that evaluates nothing never names one.
    return lines


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Provide the eval items where no collected module does (runtime/eval_items.py).

    tryfirst: before -k, -m, --deselect, --lf and the plugin's own ordering and selection,
    so they apply to these items as to imported ones. Every process decides alike (xdist
    compares the workers' collections): the same collected modules, and the controller's
    ``provide_items``.
    """
    episode_state = config.stash.get(EPISODE_STATE_KEY, None)
    if episode_state is not None:
        provide_episode_items(session, config, items, episodes)
        deselect_resumed(config, episode_state, items)
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    found = eval_item_count(items)
    if not found and state.provide_items:
        provided = collect_module_object(session, evaluation, name=PROVIDED, path=config.rootpath)
        items.extend(provided)
        found = eval_item_count(provided)
    state.collected_eval = found


def pytest_report_collectionfinish(
    config: pytest.Config, items: list[pytest.Item]
) -> list[str] | None:
    """Without xdist: where the run goes, once eval items are selected (the controller
    says it under xdist, when the workers report their collection)."""
    state = config.stash.get(STATE_KEY, None)
    if state is None or not eval_item_count(items):
        return None
    return [run_dir_line(state.run_dir)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_episodes(metafunc)
    if SCENARIO_FIXTURE not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE_KEY, None)
    if state is None:
        reason = (
            "no --ckpt given: eval items need a checkpoint profile "
            "(e.g. pytest --ckpt oracle; profiles are [tool.memeval.ckpt.*] tables)"
        )
        episode_state = metafunc.config.stash.get(EPISODE_STATE_KEY, None)
        if episode_state is not None:
            reason = (
                f"--ckpt {episode_state.profile.name} is a closed-loop profile: its items are "
                "memeval::test_episode[...]; scenario items need a benchmark profile"
            )
        metafunc.parametrize(
            SCENARIO_FIXTURE,
            [pytest.param(None, marks=pytest.mark.skip(reason=reason), id=NO_PROFILE_ID)],
            indirect=True,
        )
        return
    # The mark goes on each param: a mark added to the definition does not reach the items.
    eval_mark = pytest.mark.memeval_eval
    # The id is ids.param_id(sid): safe in node ids, -k, --deselect, --lf and JUnit for
    # any scenario id (pytest would escape non-ASCII; "::" and brackets break node ids).
    params = [pytest.param(sid, id=param_id(sid), marks=eval_mark) for sid in state.scope_ids]
    metafunc.parametrize(SCENARIO_FIXTURE, params, indirect=True)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Let ``-k`` match an eval item by its scenario id as well as by its pytest id.

    ``-k`` matches substrings of an item's names and extra keywords; the pytest id of an odd
    scenario id is a slug (``cafe_1-<hash>``), so the raw id is added too: ``-k café``
    selects ``café 1`` (``-k`` names cannot hold spaces, quotes or ``#``; see docs/habits.md).
    """
    sid = scenario_param(item)
    if sid is not None and sid != item.name:
        item.extra_keyword_matches.add(sid)


def default_decoder(
    config: pytest.Config,
    profile: Profile,
    path: str,
    device: str,
    history: str = HISTORY_TRUTH,
) -> Decoder:
    """Load the profile's checkpoint and build its decoder (the default make_decoder)."""
    if profile.kind == "replay":
        source = config.stash[STATE_KEY].replay_source
        assert source is not None  # build_state loads it for every replay profile
        return ReplayDecoder(source, history)
    loaded = load_profile_model(profile, device)
    return make_model_decoder(
        path, loaded, profile.generation.max_new_tokens, history, calibration_store(config)
    )


def calibration_store(config: pytest.Config) -> CalibrationStore | None:
    """Where the fast path keeps its calibration between runs and workers: the run's cache
    directory, keyed by the model's fingerprints (``decode/fast/stored.py``)."""
    state = config.stash[STATE_KEY]
    if state.cache_dir is None:
        return None
    return CalibrationStore(
        state.cache_dir,
        weight_fingerprints(state.fingerprints),
        run=state.run_id,
        fresh=state.recalibrate,
    )


@pytest.hookimpl(trylast=True)
def pytest_memeval_make_decoder(
    config: pytest.Config, profile: Profile, path: str, device: str, history: str
) -> Decoder | None:
    return default_decoder(config, profile, path, device, history)


__all__ = [
    "memeval_decoder",
    "memeval_episode",
    "memeval_episode_seed",
    "memeval_record",
    "memeval_scenario",
]
