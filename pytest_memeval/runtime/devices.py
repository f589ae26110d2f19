"""Which device a worker decodes on: the device list, its assignment, and applying it.

The controller decides (see :mod:`pytest_memeval.runtime.device_binding`): it resolves the list of
devices, checks there are enough for the workers, and hands each xdist worker one device as
plain data (``workerinput["memeval_device"]``: a ``CUDA_VISIBLE_DEVICES`` value such as
``"5"``, or ``"cpu"``) together with its share of the CPU threads. The worker applies it
before anything can initialise CUDA: setting ``CUDA_VISIBLE_DEVICES`` after torch has counted
the devices does nothing, which is how every worker ends up on GPU 0.

Nothing in this module imports torch at module level, and nothing in the controller
initialises CUDA: the GPUs are listed from ``--memeval-gpus``, an outer
``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L`` (a separate process that talks to the driver
through NVML, without creating a CUDA context here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

import pytest

from pytest_memeval.runtime.state import workerinput

__all__ = [
    "CPU",
    "Assignment",
    "DeviceError",
    "DevicePool",
    "DeviceSource",
    "apply_assignment",
    "assignment_for",
    "available_cores",
    "detect_gpus",
    "device_label",
    "group_devices",
    "is_out_of_memory",
    "parse_gpu_list",
    "resolve_devices",
    "threads_per_worker",
    "worker_device",
]

CPU = "cpu"
"""The device value of a worker that runs on the CPU."""

CVD = "CUDA_VISIBLE_DEVICES"

ASSIGNMENT_KEY = pytest.StashKey["Assignment"]()
"""Where a single (non-xdist) process keeps its own assignment (``--memeval-gpus`` without
``-n``); xdist workers read theirs from ``workerinput``."""


class DeviceError(ValueError):
    """A device list that cannot be used (bad syntax, outside the allowed GPUs)."""


@dataclass(frozen=True)
class DeviceSource:
    """The GPUs workers may use, and where that list came from (for messages)."""

    gpus: tuple[str, ...]
    origin: str

    @property
    def on_cpu(self) -> bool:
        return not self.gpus


@dataclass(frozen=True)
class Assignment:
    """One process's device: a ``CUDA_VISIBLE_DEVICES`` value (``"5"``, a UUID) or ``"cpu"``,
    and the number of torch threads it should use (``None``: leave torch's default)."""

    device: str
    threads: int | None = None

    @property
    def on_cpu(self) -> bool:
        return self.device == CPU

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs of this assignment (several with ``--memeval-gpus-per-worker``)."""
        return () if self.on_cpu else tuple(self.device.split(","))


# -- the device list ------------------------------------------------------------------------

_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]*$")


def parse_gpu_list(text: str, *, what: str) -> tuple[str, ...]:
    """``"0,1,3"`` -> ``("0", "1", "3")``. Ids are kept as given (``CUDA_VISIBLE_DEVICES``
    also takes ``GPU-<uuid>`` and ``MIG-<uuid>``); an empty list or a repeated id is an error.
    ``what`` names the source in messages."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise DeviceError(f"{what}: empty device id in {text!r} (expected e.g. 0,1,2)")
    for t in items:
        if not _TOKEN.match(t):
            raise DeviceError(f"{what}: {t!r} is not a GPU index or UUID")
    seen: set[str] = set()
    for t in items:
        if t in seen:
            raise DeviceError(f"{what}: GPU {t} is listed twice in {text!r}")
        seen.add(t)
    return tuple(items)


def _outer_visible(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs an outer ``CUDA_VISIBLE_DEVICES`` allows, or ``None`` when it is unset.

    CUDA stops at the first invalid entry (``-1`` hides everything after it); so do we.
    """
    raw = environ.get(CVD)
    if raw is None:
        return None
    allowed: list[str] = []
    for token in (t.strip() for t in raw.split(",")):
        if not token or token.startswith("-") or not _TOKEN.match(token):
            break
        allowed.append(token)
    return tuple(allowed)


def detect_gpus(timeout: float = 20.0) -> tuple[tuple[str, ...], str]:
    """The machine's GPUs as ``CUDA_VISIBLE_DEVICES`` values, and how they were found.

    ``nvidia-smi -L`` runs in its own process and queries the driver through NVML, so no CUDA
    context is created in the controller (which would also pin memory on GPU 0), it takes
    ~0.1 s instead of the seconds an ``import torch`` costs, and inside a container it lists
    only the GPUs the container was given (``/proc/driver/nvidia/gpus`` lists the host's). A
    GPU split into MIG instances is listed as its ``MIG-<uuid>`` instances, since one CUDA
    process can use only one MIG instance. Without ``nvidia-smi`` there is no GPU to bind.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), "no GPU found (nvidia-smi not on PATH)"
    try:
        proc = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"no GPU found (nvidia-smi -L failed: {exc})"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return (), f"no GPU found (nvidia-smi -L: {detail[0] if detail else proc.returncode})"
    return parse_nvidia_smi_list(proc.stdout), "detected with nvidia-smi -L"


def parse_nvidia_smi_list(text: str) -> tuple[str, ...]:
    """Device ids from ``nvidia-smi -L`` output: the GPU index, or its MIG instances' UUIDs."""
    gpus: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        gpu = re.match(r"^GPU (\d+):", line)
        if gpu:
            gpus.append((gpu.group(1), []))
            continue
        mig = re.match(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if mig and gpus:
            gpus[-1][1].append(mig.group(1))
    devices: list[str] = []
    for index, migs in gpus:
        devices.extend(migs or [index])
    return tuple(devices)


def resolve_devices(gpus_option: str | None, environ: Mapping[str, str]) -> DeviceSource:
    """The device list: ``--memeval-gpus``, else an outer ``CUDA_VISIBLE_DEVICES``, else the
    machine's GPUs; empty means the CPU.

    ``--memeval-gpus cpu`` forces the CPU. An explicit list must stay inside an outer
    ``CUDA_VISIBLE_DEVICES``: ids are physical (as ``nvidia-smi`` numbers them), and a job
    given GPUs 4-7 must not land on 0-3.
    """
    outer = _outer_visible(environ)
    if gpus_option is not None:
        if gpus_option.strip().lower() == CPU:
            return DeviceSource((), "--memeval-gpus cpu")
        gpus = parse_gpu_list(gpus_option, what="--memeval-gpus")
        if outer is not None:
            outside = [g for g in gpus if g not in outer]
            if outside:
                allowed = ",".join(outer) if outer else "none"
                raise DeviceError(
                    f"--memeval-gpus {gpus_option}: GPU {','.join(outside)} is outside "
                    f"CUDA_VISIBLE_DEVICES={environ.get(CVD, '')} (this job may use: {allowed}); "
                    "pick from those, or drop --memeval-gpus to use them all"
                )
        return DeviceSource(gpus, f"--memeval-gpus {gpus_option}")
    if outer is not None:
        return DeviceSource(outer, f"CUDA_VISIBLE_DEVICES={environ.get(CVD, '')}")
    gpus, how = detect_gpus()
    return DeviceSource(gpus, how)


def group_devices(gpus: Sequence[str], per_worker: int) -> tuple[str, ...]:
    """The GPUs in groups of ``per_worker``, each a ``CUDA_VISIBLE_DEVICES`` value
    (``("0", "1", "2", "3")``, 2 -> ``("0,1", "2,3")``), in list order. GPUs left over (5 GPUs
    in groups of 2) are not used. A group is one xdist worker's devices: it loads the model
    across them (``device_map="auto"``)."""
    if per_worker < 1:
        raise DeviceError(f"--memeval-gpus-per-worker must be at least 1, got {per_worker}")
    if per_worker == 1:
        return tuple(gpus)
    if len(gpus) < per_worker:
        raise DeviceError(
            f"--memeval-gpus-per-worker {per_worker}: only {len(gpus)} GPU(s) "
            f"({short_list(gpus)}) for a worker that needs {per_worker}"
        )
    n = len(gpus) // per_worker
    return tuple(",".join(gpus[i * per_worker : (i + 1) * per_worker]) for i in range(n))


# -- CPU threads ----------------------------------------------------------------------------


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a Slurm or cgroup limit)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - macOS, Windows


def threads_per_worker(n_workers: int, environ: Mapping[str, str], cores: int) -> tuple[int, str]:
    """torch threads for each of ``n_workers``, and why: an explicit ``OMP_NUM_THREADS``
    wins; else the cores are divided so N workers do not oversubscribe them."""
    raw = environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw), f"OMP_NUM_THREADS={raw}"
    share = max(1, cores // max(1, n_workers))
    return share, f"{cores} cores / {n_workers} workers"


# -- assignment (controller) ----------------------------------------------------------------


@dataclass
class DevicePool:
    """Which worker holds which device, with ``per_device`` slots on each GPU.

    A new worker gets the device with the most free slots (ties: list order), so the first
    workers spread over the GPUs round-robin. A worker that goes down frees its slot, and its
    replacement (xdist restarts a crashed worker under a new id) takes a free slot, preferably
    the very device its predecessor had.
    """

    devices: tuple[str, ...]
    per_device: int = 1
    holders: dict[str, str] = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        return len(self.devices) * self.per_device

    def free_slots(self, device: str) -> int:
        return self.per_device - sum(1 for d in self.holders.values() if d == device)

    def assign(self, worker: str, prefer: str | None = None) -> str:
        """Give ``worker`` a device (the same one again if it already holds one)."""
        held = self.holders.get(worker)
        if held is not None:
            return held
        if prefer is not None and prefer in self.devices and self.free_slots(prefer) > 0:
            chosen = prefer
        else:
            best = max(self.devices, key=lambda d: (self.free_slots(d), -self.devices.index(d)))
            if self.free_slots(best) <= 0:
                raise DeviceError(
                    f"no free device for worker {worker}: {len(self.holders)} workers hold all "
                    f"{self.capacity} slots ({len(self.devices)} GPUs x {self.per_device})"
                )
            chosen = best
        self.holders[worker] = chosen
        return chosen

    def release(self, worker: str) -> str | None:
        """Free ``worker``'s slot; returns the device it held."""
        return self.holders.pop(worker, None)


# -- applying it (worker) -------------------------------------------------------------------


def apply_assignment(
    assignment: Assignment, environ: MutableMapping[str, str] | None = None
) -> None:
    """Make this process use ``assignment``; call it before anything touches CUDA.

    Sets ``CUDA_VISIBLE_DEVICES`` (empty for the CPU, so the worker cannot stray onto a GPU),
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless set (so ids mean what ``nvidia-smi`` shows, not
    CUDA's fastest-first order) and the thread count. Raises :class:`DeviceError` when CUDA
    is already initialised on another device set: then the binding could not take effect.
    """
    env = os.environ if environ is None else environ
    wanted = "" if assignment.on_cpu else assignment.device
    if env.get(CVD) != wanted:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise DeviceError(
                f"CUDA was initialised before pytest-memeval could set {CVD}={wanted} for this "
                "worker (something imported at startup touched torch.cuda): the binding would "
                "have no effect"
            )
        env[CVD] = wanted
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if assignment.threads is not None:
        env["OMP_NUM_THREADS"] = str(assignment.threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(assignment.threads)


def assignment_for(config: pytest.Config) -> Assignment | None:
    """This process's assignment: from ``workerinput`` in an xdist worker, from the stash in a
    single bound process, ``None`` when the plugin does not bind devices in this run."""
    wi = workerinput(config)
    if wi is not None:
        device = wi.get("memeval_device")
        if not device:
            return None
        return Assignment(str(device), wi.get("memeval_torch_threads"))
    return config.stash.get(ASSIGNMENT_KEY, None)


def worker_device(config: pytest.Config) -> str:
    """The torch device string this process decodes on (``cuda:0``, ``cuda``, ``cpu``, or
    ``auto``: the model is spread over several GPUs with ``device_map="auto"``).

    A bound process sees exactly its own GPUs: one (``cuda:0``), or the K of
    ``--memeval-gpus-per-worker K`` (``auto``). This is the first place that imports torch in
    a worker; the thread count is applied to torch here too.
    """
    assignment = assignment_for(config)
    # Deferred: importing torch may initialise CUDA, which must wait until the worker applied
    # its CUDA_VISIBLE_DEVICES (see the module docstring); it also takes seconds.
    import torch

    if assignment is not None:
        if assignment.threads is not None:
            torch.set_num_threads(assignment.threads)
        if assignment.on_cpu:
            return CPU
        return "auto" if len(assignment.gpus) > 1 else "cuda:0"
    return "cuda" if torch.cuda.is_available() else CPU


def _threads_text(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def describe_assignment(assignment: Assignment) -> str:
    """How an assignment reads in the header and in records: ``cuda:0 (physical 5)``,
    ``cuda:0 (MIG-...)``, ``cpu (2 threads)``."""
    if assignment.on_cpu:
        return CPU if assignment.threads is None else f"{CPU} ({_threads_text(assignment.threads)})"
    gpus = assignment.gpus
    if len(gpus) > 1:
        what = "physical " + ",".join(gpus) if all(g.isdigit() for g in gpus) else ",".join(gpus)
        return f"cuda:0-{len(gpus) - 1} ({what})"
    what = f"physical {assignment.device}" if assignment.device.isdigit() else assignment.device
    return f"cuda:0 ({what})"


#: What a replay run's records note as their device: it decodes nothing, on no device.
REPLAY_DEVICE_LABEL = "none (replay)"


def device_label(config: pytest.Config, torch_device: str) -> str:
    """What a record notes as its device: the torch device plus which physical device or how
    many threads it was, e.g. ``cuda:0 (physical 5)`` or ``cpu (2 threads)``."""
    assignment = assignment_for(config)
    if assignment is not None and not assignment.on_cpu:
        return describe_assignment(assignment)
    if torch_device == CPU:
        # What torch really uses (after worker_device applied the share), not what was asked.
        # Deferred like worker_device's: torch only after the device is bound.
        import torch

        return f"{CPU} ({_threads_text(torch.get_num_threads())})"
    outer = os.environ.get(CVD)
    return torch_device if outer is None else f"{torch_device} ({CVD}={outer})"


def short_list(items: Sequence[str]) -> str:
    return ",".join(items) if items else "none"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device running out of memory: torch's ``OutOfMemoryError`` (CUDA),
    the RuntimeError text older torch and other backends (MPS) raise, or Python's MemoryError.

    Read from the class name and the text, so this module need not import torch.
    """
    if isinstance(exc, MemoryError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "OutOfMemoryError" in names or "out of memory" in str(exc).lower()
