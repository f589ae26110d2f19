"""One device per xdist worker: the controller assigns, each worker applies before CUDA starts.

Registered by :mod:`pytest_memeval.plugin` (``pytest_plugins``) so that its early hooks run.
Binding is on when the run evaluates (``--ckpt``) or names devices (``--memeval-gpus``); a
plain ``pytest -n 8`` of another project with the plugin installed is left alone.

* Controller (``pytest_configure``): resolve the device list (:func:`.devices.resolve_devices`),
  refuse more workers than device slots, divide the CPU threads, and register
  :class:`XdistDeviceBinder`, which hands each worker its device.
* Hand-over: before xdist starts a worker process, :meth:`XdistDeviceBinder.pytest_xdist_setupnodes`
  puts the device into the worker's execnet spec environment, so ``CUDA_VISIBLE_DEVICES`` is
  set before the worker's Python imports anything (conftests included);
  ``pytest_configure_node`` puts the same device into ``workerinput`` as plain data, which
  the worker checks and re-applies in its first hook (``pytest_cmdline_main``) and which
  records and the header report.
* A worker that goes down frees its device (``pytest_testnodedown``); xdist's replacement
  (a new id, ``gwN``) reuses the dead worker's spec and is given that same free device.
* Without xdist, ``--memeval-gpus`` binds the single process to the first listed device,
  before the initial conftests are imported.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# execnet comes with pytest-xdist (a dependency) and imports in milliseconds: no reason to defer.
import execnet
import pytest

from pytest_memeval.compat.xdist import worker_specs
from pytest_memeval.runtime.devices import (
    ASSIGNMENT_KEY,
    CPU,
    CVD,
    Assignment,
    DeviceError,
    DevicePool,
    DeviceSource,
    apply_assignment,
    assignment_for,
    available_cores,
    describe_assignment,
    group_devices,
    resolve_devices,
    short_list,
    threads_per_worker,
)
from pytest_memeval.runtime.state import is_worker

__all__ = ["BINDER_NAME", "XdistDeviceBinder"]

BINDER_NAME = "memeval-device-binder"

#: A single bound process keeps where its device came from here (for the header).
_SOURCE_KEY = pytest.StashKey[DeviceSource]()


def _binding_requested(ns: Any) -> bool:
    return bool(getattr(ns, "memeval_ckpt", None) or getattr(ns, "memeval_gpus", None))


def _xdist_requested(ns: Any) -> bool:
    """Whether the command line asks for xdist workers (before xdist has normalised it)."""
    if getattr(ns, "numprocesses", None):
        return True
    return bool(getattr(ns, "tx", None)) or getattr(ns, "dist", "no") not in (None, "no")


# -- single process and worker: apply before anything touches CUDA --------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Single process with ``--memeval-gpus``: bind it to the first device now, before the
    initial conftests (which may import torch) are loaded."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # an xdist worker: its device came in its spec environment
    ns = early_config.known_args_namespace
    gpus = getattr(ns, "memeval_gpus", None)
    if gpus is None or _xdist_requested(ns) or getattr(ns, "help", False):
        return
    try:
        source = resolve_devices(gpus, os.environ)
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        per_worker = int(getattr(ns, "memeval_gpus_per_worker", 1) or 1)
        groups = group_devices(source.gpus, per_worker) if source.gpus else ()
        assignment = Assignment(groups[0] if groups else CPU)
        apply_assignment(assignment)
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None
    early_config.stash[ASSIGNMENT_KEY] = assignment
    early_config.stash[_SOURCE_KEY] = source


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """xdist worker: the first hook that sees ``workerinput``; make sure its device holds
    (the spec environment normally set it already) before ``pytest_configure`` runs."""
    if not is_worker(config):
        return
    assignment = assignment_for(config)
    if assignment is None:
        return
    try:
        apply_assignment(assignment)
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None


# -- controller -----------------------------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` with binding on and GPUs present: one worker per GPU slot (GPUs x
    ``--memeval-workers-per-gpu``), not one per CPU core."""
    if not _binding_requested(config.option):
        return None
    try:
        source = resolve_devices(config.getoption("memeval_gpus"), os.environ)
    except DeviceError:
        return None  # pytest_configure reports it
    if source.on_cpu:
        return None
    try:
        groups = group_devices(source.gpus, int(config.getoption("memeval_gpus_per_worker")))
    except DeviceError:
        return None  # pytest_configure reports it
    return len(groups) * max(1, int(config.getoption("memeval_workers_per_gpu")))


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config) or not _binding_requested(config.option):
        return
    if not config.pluginmanager.has_plugin("xdist"):
        return
    if config.getoption("dist", "no") == "no" or config.getoption("collectonly"):
        return
    specs = worker_specs(config)  # compat.xdist
    if any(not execnet.XSpec(s).popen for s in specs):
        return  # remote (--tx ssh=...) workers: their GPUs are not ours to list
    per_device = config.getoption("memeval_workers_per_gpu")
    if per_device < 1:
        raise pytest.UsageError(f"--memeval-workers-per-gpu must be at least 1, got {per_device}")
    per_worker = config.getoption("memeval_gpus_per_worker")
    if per_worker > 1 and per_device > 1:
        raise pytest.UsageError(
            f"--memeval-gpus-per-worker {per_worker} and --memeval-workers-per-gpu {per_device} "
            "cannot be combined: a worker either shares a GPU or spans several"
        )
    try:
        source = resolve_devices(config.getoption("memeval_gpus"), os.environ)
        groups = group_devices(source.gpus, per_worker)
    except DeviceError as exc:
        raise pytest.UsageError(str(exc)) from None
    n_workers = len(specs)
    if not source.on_cpu and per_worker > 1 and n_workers > len(groups):
        raise pytest.UsageError(
            f"pytest-memeval: {n_workers} xdist workers with {per_worker} GPUs each need "
            f"{n_workers * per_worker} GPUs, but there are {len(source.gpus)} "
            f"({short_list(source.gpus)}, {source.origin}), i.e. at most {len(groups)} "
            f"workers. Use -n {len(groups)}."
        )
    if not source.on_cpu and n_workers > len(source.gpus) * per_device:
        allow = -(-n_workers // len(source.gpus))
        raise pytest.UsageError(
            f"pytest-memeval: {n_workers} xdist workers but {len(source.gpus)} GPU(s) "
            f"({short_list(source.gpus)}, {source.origin}) with {per_device} worker(s) per GPU, "
            f"i.e. at most {len(source.gpus) * per_device} workers. Use -n "
            f"{len(source.gpus) * per_device}, or allow several workers per GPU with "
            f"--memeval-workers-per-gpu {allow}."
        )
    threads, why = threads_per_worker(n_workers, os.environ, available_cores())
    binder = XdistDeviceBinder(source, per_device, threads, why, n_workers, per_worker)
    config.pluginmanager.register(binder, BINDER_NAME)


class XdistDeviceBinder:
    """Controller-side xdist hooks: which worker holds which device (registered only under
    xdist with binding on)."""

    def __init__(
        self,
        source: DeviceSource,
        per_device: int,
        threads: int,
        why: str,
        n_workers: int,
        gpus_per_worker: int = 1,
    ) -> None:
        self.source = source
        self.n_workers = n_workers
        self.threads = threads
        self.threads_why = why
        self.gpus_per_worker = gpus_per_worker
        # With --memeval-gpus-per-worker K a pool "device" is a group of K GPUs ("0,1").
        units = group_devices(source.gpus, gpus_per_worker) if source.gpus else (CPU,)
        self.pool = DevicePool(units, per_device if source.gpus else 1 << 30)
        self.order: list[str] = []  # worker ids in the order they were assigned
        self.down: list[tuple[str, str]] = []  # (worker, device) of workers that went down
        self.events: list[str] = []

    def assignment(self, device: str) -> Assignment:
        return Assignment(device, self.threads)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config, specs: Sequence[Any]) -> None:
        """Before any worker process starts: assign each spec a device and put it in the
        spec's environment (execnet sets it in the new process before running any code)."""
        for spec in specs:
            self._assign(str(spec.id), spec)

    def _assign(self, worker: str, spec: Any) -> str:
        env: dict[str, str] = spec.env
        prefer = env.get(CVD) if env.get(CVD) else None
        device = self.pool.assign(worker, prefer=None if self.source.on_cpu else prefer)
        assignment = self.assignment(device)
        env[CVD] = "" if assignment.on_cpu else device
        env["OMP_NUM_THREADS"] = str(self.threads)
        if worker not in self.order:
            self.order.append(worker)
        return device

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Hand the device over as plain data; a replacement worker (new id) gets a free one."""
        worker = str(node.gateway.id)
        fresh = worker not in self.pool.holders
        device = self._assign(worker, node.gateway.spec)
        if fresh and self.down:
            dead, dead_device = self.down.pop(0)
            self.events.append(
                f"{worker} replaced {dead} (which went down) on "
                f"{describe_assignment(self.assignment(device))}"
                + ("" if device == dead_device else f", not {dead_device}")
            )
        node.workerinput["memeval_device"] = device
        node.workerinput["memeval_torch_threads"] = self.threads

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        worker = str(node.gateway.id)
        device = self.pool.release(worker)
        if error is not None and device is not None:
            self.down.append((worker, device))

    def mapping(self) -> list[str]:
        """``gw0 -> cuda:0 (physical 4)``, ... as assigned, or as they will be: the terminal
        header is written before xdist starts the workers, and the assignment is
        deterministic (xdist names them gw0, gw1, ... in order)."""
        pool = self.pool
        order = self.order
        if not order:
            pool = DevicePool(self.pool.devices, self.pool.per_device)
            order = [f"gw{i}" for i in range(self.n_workers)]
            for worker in order:
                pool.assign(worker)
        return [
            f"{w} -> {describe_assignment(self.assignment(pool.holders[w]))}"
            for w in order
            if w in pool.holders
        ]

    def header(self) -> list[str]:
        src = self.source
        if src.on_cpu:
            first = (
                f"memeval: workers on the CPU ({src.origin}), {self.threads} torch thread(s) "
                f"each ({self.threads_why})"
            )
        else:
            share = (
                f"{self.gpus_per_worker} GPUs per worker (device_map over them)"
                if self.gpus_per_worker > 1
                else f"{self.pool.per_device} worker(s) per GPU"
            )
            first = (
                f"memeval: GPUs {short_list(src.gpus)} ({src.origin}), {share}, "
                f"{self.threads} torch thread(s) per worker ({self.threads_why})"
            )
        mapping = self.mapping()
        return [first] + ([f"memeval: workers: {', '.join(mapping)}"] if mapping else [])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for event in self.events:
            terminalreporter.write_line(f"memeval: {event}", yellow=True)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    binder = config.pluginmanager.get_plugin(BINDER_NAME)
    if isinstance(binder, XdistDeviceBinder):
        return binder.header()
    assignment = config.stash.get(ASSIGNMENT_KEY, None)
    source = config.stash.get(_SOURCE_KEY, None)
    if assignment is not None and source is not None and not is_worker(config):
        extra = "" if len(source.gpus) <= 1 else " (single process: the first; -n N uses more)"
        return [f"memeval: device {describe_assignment(assignment)} from {source.origin}{extra}"]
    return None
