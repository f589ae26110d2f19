"""Run state kept in ``config.stash``, and the one typed accessor for xdist's workerinput.

Only plain data crosses processes: the controller puts strings and numbers into
``workerinput`` (see :class:`MemevalWorkerInput`): the resolved profile itself, so a worker
never looks for the profiles file; each worker loads the benchmark that profile names and
checks the fingerprint it computes against the controller's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import pytest

from pytest_memeval.core.benchmark import Benchmark, Scenario
from pytest_memeval.core.profiles import Profile

if TYPE_CHECKING:
    from pytest_memeval.decode.replay import ReplaySource

__all__ = [
    "STATE_KEY",
    "MemevalState",
    "MemevalWorkerInput",
    "is_worker",
    "worker_id",
    "workerinput",
]


class MemevalWorkerInput(TypedDict, total=False):
    """What the controller hands each worker in ``pytest_configure_node``."""

    memeval_benchmark_fingerprint: str
    #: the worker's CUDA_VISIBLE_DEVICES value ("5", "MIG-...") or "cpu" (device_binding.py)
    memeval_device: str
    memeval_torch_threads: int  # torch threads: the worker's share of the cores
    #: --memeval-expect: the known-failure item names, read once on the controller (gate.py)
    memeval_known_failures: list[str]
    memeval_known_failures_source: str
    memeval_resume_done: list[str]  # --memeval-resume: scenario ids the journal has
    #: the profile the controller resolved, overrides applied (profiles.profile_to_plain):
    #: workers never look for the profiles file themselves
    memeval_profile: dict[str, Any]
    #: what --memeval-model/--memeval-adapter/--memeval-set changed (profiles.apply_overrides)
    memeval_overrides: dict[str, dict[str, str | None]]
    memeval_run_dir: str  # the controller's run directory
    memeval_decode_path: str  # fast, reference or replay (option or ini, read once)
    memeval_history: str  # truth or model (--memeval-history or ini, read once)
    #: the controller's rootdir and config file (None: none), which every worker must share
    memeval_rootdir: str
    memeval_inifile: str | None
    #: --memeval-allow-overlong: id -> {"tokens", "limit"} of those past the context (preflight.py)
    memeval_overlong: dict[str, dict[str, int]]
    #: the fast path's calibration store (decode/fast/stored.py): the cache directory, the
    #: model's fingerprints, this run's id, and --memeval-recalibrate (calibration_store())
    memeval_cache_dir: str
    memeval_fingerprints: dict[str, str | None]
    memeval_run_id: str
    memeval_recalibrate: bool
    #: whether the plugin provides the eval items where no collected module does (decided
    #: once on the controller: every worker must collect the same items)
    memeval_provide_items: bool
    #: a closed-loop run's fingerprints and environment description (runtime/episodes/items.py)
    memeval_episode_state: dict[str, Any]
    #: set by xdist itself: the controller's sys.argv (the user's own command line)
    mainargv: list[str]


def workerinput(config: pytest.Config) -> MemevalWorkerInput | None:
    """This worker's input from the controller, or ``None`` outside an xdist worker."""
    raw = getattr(config, "workerinput", None)
    return cast(MemevalWorkerInput, raw) if raw is not None else None


def is_worker(config: pytest.Config) -> bool:
    return workerinput(config) is not None


def worker_id(config: pytest.Config) -> str:
    """``gw0``, ``gw1``... under xdist; ``master`` otherwise (xdist's own convention)."""
    raw = getattr(config, "workerinput", None)
    if raw is None:
        return "master"
    return str(raw.get("workerid", os.environ.get("PYTEST_XDIST_WORKER", "master")))


@dataclass
class MemevalState:
    """Everything the plugin knows about the current run, built in ``pytest_configure``."""

    profile: Profile
    benchmark: Benchmark
    scope_ids: list[str]
    run_dir: Path
    decode_path: str
    fingerprints: dict[str, str | None]
    shard: tuple[int, int] | None = None
    #: ``truth`` (teacher-forced) or ``model`` (free-running): what the prompts hold as the
    #: earlier assistant messages (core/history.py)
    history: str = "truth"
    #: what --memeval-model/--memeval-adapter/--memeval-set changed (profiles.apply_overrides)
    overrides: dict[str, dict[str, str | None]] = field(default_factory=dict)
    #: --memeval-allow-overlong: id -> {"tokens", "limit"} of those past the context (preflight)
    overlong: dict[str, dict[str, int]] = field(default_factory=dict)
    #: a replay profile's predictions, checked against the benchmark once at configure
    replay_source: ReplaySource | None = None
    #: the journal this run writes, once it is open (the controller's; startup.py names it)
    journal: str | None = None
    #: the one message of a failed model load or worker start-up: the run then writes nothing
    startup_failure: str | None = None
    #: a GGUF model's conversion, for the report header (model/gguf.py; controller only)
    gguf: str | None = None
    #: the cache directory (core/cache.py), resolved once on the controller
    cache_dir: Path | None = None
    #: this run's id (the controller's; stored with the calibrations it measures)
    run_id: str = ""
    #: --memeval-recalibrate / memeval_recalibrate: measure the calibration again (once per run)
    recalibrate: bool = False
    #: whether the plugin provides the eval items where no collected module does
    #: (runtime/eval_items.py's covers_project, the controller's decision on a worker)
    provide_items: bool = False
    #: eval items this process collected, before -k, -m or --deselect (plugin.py)
    collected_eval: int = 0

    @cached_property
    def scenarios(self) -> dict[str, Scenario]:
        return self.benchmark.by_id()


STATE_KEY = pytest.StashKey[MemevalState]()
