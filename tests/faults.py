"""Real faults for end-to-end runs: a conftest that a pytester project installs.

Set in the environment of the run, by scenario id: ``FAULT_KILL`` (the xdist worker running
it dies by SIGKILL), ``FAULT_INTERRUPT`` (KeyboardInterrupt before it runs), ``FAULT_RAISE``
(the model call raises, in the batched prefetch as in the rollout). Without them the project
runs normally, so a resume run is the same project without the fault.
"""

from __future__ import annotations

FAULTS_CONFTEST = '''
import os
import signal

import pytest


def _scenario(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("memeval_scenario") if callspec else None


def pytest_runtest_setup(item):
    sid = _scenario(item)
    if sid is not None and sid == os.environ.get("FAULT_KILL") and os.environ.get(
        "PYTEST_XDIST_WORKER"
    ):
        os.kill(os.getpid(), signal.SIGKILL)  # a real, uncatchable death of this worker
    if sid is not None and sid == os.environ.get("FAULT_INTERRUPT"):
        raise KeyboardInterrupt


class _FailingDecoder:
    """The real decoder, except that the model call raises for one scenario."""

    def __init__(self, inner):
        self.inner = inner
        self.path = inner.path

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefetch(self, scenarios):
        # A batched model call containing the bad scenario fails as a whole.
        if any(s.id == os.environ.get("FAULT_RAISE") for s in scenarios):
            raise RuntimeError("batched model call failed (injected)")
        return self.inner.prefetch(scenarios)

    def rollout(self, scenario):
        if scenario.id == os.environ.get("FAULT_RAISE"):
            raise RuntimeError(f"model call failed on {scenario.id} (injected)")
        return self.inner.rollout(scenario)


@pytest.hookimpl(hookwrapper=True)
def pytest_memeval_make_decoder():
    outcome = yield
    outcome.force_result(_FailingDecoder(outcome.get_result()))
'''


#: Worker deaths at chosen moments, each once per run (a flag file says it happened, so a
#: replacement worker is not killed again), for the fault sweep
#: (tests/integration/test_worker_faults.py). Set in the run's environment:
#:
#: - ``WORKER_FAULT``: ``collect`` (gw0 dies as its collection finishes: it is still
#:   starting), ``scenario:ID`` (the worker about to run a first item of scenario ``ID``
#:   dies; ``ID,ID2,...`` kills once per scenario, whichever worker runs it),
#:   ``calibration`` (the worker measuring the fast path's calibration dies inside the
#:   measurement, holding the calibration store's lock), ``finish`` (gw0 dies after its last
#:   item, as its session ends);
#: - ``WORKER_FAULT_FLAGS``: a directory for the flag files;
#: - ``WORKER_STOP``: ``scenario:ID``: the worker stops itself (SIGSTOP) instead of dying; its
#:   pid is written to ``WORKER_FAULT_FLAGS/stopped.pid`` so the test can end it.
WORKER_FAULTS_CONFTEST = """
import os
import signal
from pathlib import Path

import pytest

FAULT = os.environ.get("WORKER_FAULT", "")
STOP = os.environ.get("WORKER_STOP", "")
FLAGS = Path(os.environ.get("WORKER_FAULT_FLAGS", "."))
WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def _once(name):
    flag = FLAGS / f"fault-{name}"
    try:
        flag.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def _die(name):
    if WORKER and _once(name):
        os.kill(os.getpid(), signal.SIGKILL)  # a real, uncatchable death of this worker


def _scenario(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("memeval_scenario") if callspec else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    if FAULT == "collect" and WORKER == "gw0":
        _die("collect")  # before the worker reports its collection


def pytest_runtest_setup(item):
    sid = _scenario(item)
    if sid is None:
        return
    if FAULT.startswith("scenario:") and sid in FAULT.split(":", 1)[1].split(","):
        _die(f"scenario-{sid}")
    if STOP == f"scenario:{sid}" and WORKER and _once(f"stop-{sid}"):
        (FLAGS / "stopped.pid").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if FAULT == "finish" and WORKER == "gw0":
        _die("finish")


if FAULT == "calibration":
    from pytest_memeval.decode.fast import stored

    _measure = stored._measure

    def _dying_measure(*args, **kwargs):
        _die("calibration")
        return _measure(*args, **kwargs)

    stored._measure = _dying_measure
"""
