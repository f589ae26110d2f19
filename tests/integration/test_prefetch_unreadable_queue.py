"""Under xdist, a worker whose queue of next items cannot be read says prefetch is off.

``compat.xdist.pending_item_indices`` reads pytest-xdist's private worker queue; where an
xdist release changes it, the answer is "unavailable" and the worker turns batched prefetch
off with a :class:`~pytest_memeval.runtime.worker.PrefetchWarning`, rather than silently
running slower. The project's conftest hides the queue's ``lock()`` on each worker, as a
release without it (3.5) would; the run itself must be unaffected.
"""

from __future__ import annotations

import pytest

from ..conftest import MemevalProject, demo_records

HIDE_QUEUE_LOCK = """
import pytest


class _QueueWithoutLock:
    # xdist's TestQueue, minus the lock() that compat.xdist reads it through.
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        if name == "lock":
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    for plugin in session.config.pluginmanager.get_plugins():
        if getattr(plugin, "torun", None) is not None:
            plugin.torun = _QueueWithoutLock(plugin.torun)
"""


@pytest.mark.slow
def test_unreadable_xdist_queue_warns_that_prefetch_is_off(
    memeval_project: MemevalProject,
) -> None:
    memeval_project.write(demo_records("oracle", 6))
    memeval_project.pytester.makeconftest(HIDE_QUEUE_LOCK)
    result = memeval_project.run("--ckpt", "demo", "-n", "2")
    out = result.stdout.str()
    assert result.ret in (0, 1), out  # 1 only for wrong answers
    assert "PrefetchWarning: batched prefetch is off on worker gw" in out, out
    assert "cannot be read" in out
    metrics = memeval_project.metrics()
    assert metrics["complete"] is True and metrics["n"] == 6
    # Each scenario was decoded in a forward pass of its own, none batched with another.
    preds = memeval_project.predictions()
    assert len(preds) == 6 and all(r["decode_batch"] == 1 for r in preds), preds
