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
