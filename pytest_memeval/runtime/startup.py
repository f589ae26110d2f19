"""A worker that cannot start, or cannot load its model, stops the run once, before items run.

Without this, a worker that fails at start-up is replaced by xdist again and again (its
replacement fails the same way) and the run ends with "0 scenarios (INCOMPLETE)"; a model that
cannot be loaded (no CUDA in this torch build, a GPU id that does not exist, out of memory, a
broken weight file) fails every item with the same traceback. Here:

* Each process loads its decoder before any item runs (:class:`EarlyLoad`), once collection
  has selected eval items (an xdist worker: before it reports its collection). A failure
  becomes one message saying what failed where and what to do
  (:func:`describe_load_failure`), raised as a usage error (exit status 4) or, for an
  unexpected exception, an internal error (exit status 3).
* In a worker the failure goes into ``workeroutput`` (plain data) and the worker's session
  ends with a :class:`pytest.UsageError`. The controller's :class:`StartupWatch` reads it
  when the worker goes down; a worker that went down before it finished collecting for any
  other reason (a conftest or plugin failing at configure) is read from the error xdist
  hands over (its traceback). Either way the whole run stops with that worker's message:
  no replacement workers, no item reports, and the run directory left as it was (the
  controller writes nothing when ``state.startup_failure`` is set). A replacement
  worker (xdist restarts one that crashed mid-run) that fails the same way stops the run
  too; the scenarios evaluated before stay in the run's journal, and the message says where
  and to continue with ``--memeval-resume``.

The same stop ends a ``--ckpt`` run that collected eval items but selected none (every one
deselected by ``-k``, ``-m`` or ``--deselect``): one line (:func:`nothing_selected`), exit
status 4, no model loaded, no run directory named or written. ``--lf``, ``--sw`` and
``--memeval-resume`` are exempt: an empty selection is what they ask for there.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pytest_memeval.core.benchmark import BenchmarkError
from pytest_memeval.model.checks import CheckpointError
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.state import MemevalState, is_worker, worker_id

if TYPE_CHECKING:
    from pytest_memeval.runtime.worker import MemevalWorker

__all__ = [
    "INTERNAL_TAG",
    "EarlyLoad",
    "StartupWatch",
    "describe_load_failure",
    "evaluates_nothing",
    "nothing_selected",
    "parse_worker_error",
]

USAGE = 4
INTERNAL = 3


#: Marks a worker's start-up message as an internal error (exit status 3, not 4). Both kinds
#: leave the worker as a pytest.UsageError: the one exception that ends an xdist worker's
#: start-up cleanly (others become an ``internal_error`` event and a worker "not properly
#: terminated"), and a final class, so the kind rides in the message.
INTERNAL_TAG = "[internal error] "

#: The end of a start-up failure's message; StartupWatch replaces it when scenarios were
#: journaled before (a replacement worker that failed mid-run).
NOTHING_WRITTEN = "The run was stopped before any scenario ran; nothing was written."

#: Where a worker puts its start-up failure for the controller (``config.workeroutput``).
OUTPUT_KEY = "memeval_startup_failure"


#: Option destinations of sessions that evaluate nothing: they load no model, take no lock
#: and write nothing (``--help`` and ``--markers`` configure plugins, ``--fixtures`` and
#: ``--fixtures-per-test`` even collect).
_EVALUATES_NOTHING = (
    "collectonly",
    "setupplan",
    "help",
    "showfixtures",
    "show_fixtures_per_test",
    "markers",
    "version",
)


def evaluates_nothing(config: pytest.Config) -> bool:
    """Whether this session only shows something (help, fixtures, markers, collection)."""
    return any(config.getoption(name, False) for name in _EVALUATES_NOTHING)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe_load_failure(
    exc: BaseException, *, where: str, what: str, device: str
) -> tuple[int, str]:
    """Exit status and the one message for a decoder that could not be built.

    ``where`` names the process (``worker gw0``; empty without xdist), ``what`` the
    checkpoint, ``device`` the device it was loaded on (``cuda:0 (physical 3)``, ``cpu``).
    """
    name = type(exc).__name__
    text = str(exc)
    head = f"pytest-memeval: {where + ' ' if where else ''}could not load {what} on {device}"
    stopped = NOTHING_WRITTEN
    no_cuda = (
        f"{head}: this torch build has no CUDA support ({_torch_version()}). Install a "
        f"CUDA build of torch, or run on the CPU with --memeval-gpus cpu. {stopped}"
    )
    if "Torch not compiled with CUDA" in text:
        return USAGE, no_cuda
    if "OutOfMemoryError" in name or "out of memory" in text.lower():
        return USAGE, (
            f"{head}: out of memory ({_first_line(exc)}). Free the GPU, allow fewer workers "
            "per GPU (--memeval-workers-per-gpu), or use a smaller dtype "
            f"(--memeval-set generation.dtype=bfloat16). {stopped}"
        )
    if any(s in text for s in ("invalid device ordinal", "No CUDA GPUs are available", "no CUDA")):
        return USAGE, (
            f"{head}: the GPU is not usable here ({_first_line(exc)}). Check the ids given to "
            f"--memeval-gpus (or CUDA_VISIBLE_DEVICES) against nvidia-smi -L. {stopped}"
        )
    if isinstance(exc, CheckpointError | BenchmarkError):
        return USAGE, f"{head}: {text.strip()}. {stopped}"
    if "Safetensor" in name or "deserializ" in text or isinstance(exc, OSError):
        return USAGE, (
            f"{head}: a checkpoint file could not be read ({name}: {_first_line(exc)}); is a "
            "weight file broken or incompletely copied? Check the profile's model/adapter "
            f"directories (or --memeval-model/--memeval-adapter). {stopped}"
        )
    if device.startswith("cuda") and _torch_without_cuda():
        return USAGE, no_cuda
    return INTERNAL, (
        f"{head}: unexpected {name}: {_first_line(exc)}. This is an internal error (of "
        f"pytest-memeval or of a plugin's pytest_memeval_make_decoder). {stopped}"
    )


def _torch_version() -> str:
    try:
        # Deferred: torch takes seconds; only an error report on a model run reads it.
        import torch

        return f"torch {torch.__version__}"
    except ImportError:  # pragma: no cover - torch is a dependency
        return "torch missing"


def _torch_without_cuda() -> bool:
    try:
        import torch  # deferred: as in _torch_version
    except ImportError:  # pragma: no cover
        return True
    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


class EarlyLoad:
    """Load this process's decoder before any item runs; stop the run once if it fails."""

    def __init__(self, config: pytest.Config, worker: MemevalWorker, state: MemevalState) -> None:
        self.config = config
        self.worker = worker
        self.state = state

    def _wanted(self) -> bool:
        return not evaluates_nothing(self.config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # Once collection (and -k/--deselect) has decided: only when eval items were selected.
        # tryfirst: in an xdist worker, before it reports its collection to the controller.
        if not self._wanted():
            return
        if any(scenario_param(item) is not None for item in session.items):
            self._load()
        elif self.state.collected_eval and not _selection_kept_elsewhere(self.config):
            self._fail(USAGE, nothing_selected(self.state.profile.name, self.state.collected_eval))

    def _load(self) -> None:
        try:
            self.worker.load_decoder()
        except Exception as exc:  # classified below; nothing may reach the items
            self._stop(exc)

    def _stop(self, exc: Exception) -> NoReturn:
        p = self.state.profile
        if p.kind == "model":
            what = f"model {p.model}" + (f" with adapter {p.adapter}" if p.adapter else "")
        else:
            what = f"replay predictions {p.predictions}"
        wid = worker_id(self.config)
        where = f"worker {wid}" if wid != "master" else ""
        status, message = describe_load_failure(
            exc, where=where, what=what, device=self.worker.device_label
        )
        self._fail(status, message)

    def _fail(self, status: int, message: str) -> NoReturn:
        self.state.startup_failure = message
        if is_worker(self.config):
            # The worker's session ends with this usage error and sends its workeroutput;
            # the controller's StartupWatch reads the failure from there (plain data).
            output = getattr(self.config, "workeroutput", None)
            if isinstance(output, dict):
                output[OUTPUT_KEY] = {"status": status, "message": message}
            raise pytest.UsageError(message if status == USAGE else INTERNAL_TAG + message)
        if status == USAGE:
            raise pytest.UsageError(message)
        pytest.exit(message, returncode=INTERNAL)


def nothing_selected(ckpt: str, collected: int) -> str:
    """The one line of a run whose eval items were all deselected (``-k``, ``-m``,
    ``--deselect``, a plugin's selection): it evaluates nothing and writes nothing."""
    return (
        f"pytest-memeval: --ckpt {ckpt}: all {collected} eval items were deselected "
        "(-k, -m or --deselect); nothing was evaluated and no run directory was written."
    )


def _selection_kept_elsewhere(config: pytest.Config) -> bool:
    """Whether an empty selection of eval items is what was asked for: ``--lf`` and
    ``--sw`` rerun only earlier failures, and ``--memeval-resume`` only the scenarios its
    journal lacks (the controller reports a journal that already has them all)."""
    return any(config.getoption(name, False) for name in ("lf", "stepwise", "memeval_resume"))


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?:: (.*))?$")


def parse_worker_error(error: object) -> tuple[int, str]:
    """Exit status and message of a worker that went down at start-up, from the error text
    xdist hands over (the worker's formatted traceback): the exception line after the last
    frame, and the lines of its message that follow."""
    text = str(error).rstrip()
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if not line or line[0].isspace() or line.startswith("Traceback"):
            continue
        match = _EXC_LINE.match(line)
        if match and (i == 0 or lines[i - 1].startswith(" ")):
            exc_name = match.group(1)
            message = "\n".join([match.group(2) or "", *lines[i + 1 :]]).strip() or exc_name
            if not exc_name.endswith("UsageError"):
                return INTERNAL, f"{exc_name}: {message}"
            if message.startswith(INTERNAL_TAG):
                return INTERNAL, message[len(INTERNAL_TAG) :]
            return USAGE, message
    return INTERNAL, lines[-1] if lines else "the worker went down"


class StartupWatch:
    """Controller side, under xdist: a worker that goes down before it finished collecting
    stops the run at once with that worker's own message."""

    def __init__(self, state: MemevalState) -> None:
        self.state = state
        self.started: set[str] = set()

    @staticmethod
    def _id(node: Any) -> str:
        return str(getattr(getattr(node, "gateway", None), "id", node))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.started.add(self._id(node))

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        wid = self._id(node)
        if self.state.startup_failure:
            return
        output = getattr(node, "workeroutput", None)
        reported = output.get(OUTPUT_KEY) if isinstance(output, dict) else None
        if isinstance(reported, dict):
            # Our own EarlyLoad failed in the worker and said so in its output.
            status, message = int(reported["status"]), str(reported["message"])
        elif error is None or wid in self.started:
            return  # a clean finish, or a crash while running items (xdist handles those)
        else:
            status, message = parse_worker_error(error)
        if not message.startswith("pytest-memeval:"):
            message = f"worker {wid} failed to start: {message}"
        journal = self.state.journal
        if journal:
            # A replacement worker failed after scenarios ran (the controller opened the
            # journal at the first record): they are kept, and can be continued.
            message = message.replace(f" {NOTHING_WRITTEN}", "") + (
                f" The run was stopped; the scenarios evaluated before are kept in {journal}: "
                "rerun with --memeval-resume to evaluate only the others."
            )
        self.state.startup_failure = message
        if status == USAGE:
            raise pytest.UsageError(message)
        pytest.exit(message, returncode=INTERNAL)
