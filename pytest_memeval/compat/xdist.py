"""pytest-xdist internals: loadscope's private hooks and state, the worker's queue, names.

xdist has no public API for a custom scope or for topping a worker up with several scopes at
once, so ``runtime/scheduler.py`` subclasses its ``LoadScopeScheduling``. That subclass is
unavoidable; :class:`ScopeScheduling` is the adapter in between, which gives each private hook
and attribute the subclass needs a public, typed name here, so that the scheduler itself names
no xdist internal. A pytest-xdist without them stops the run at start-up with one clear error
(:func:`require_scope_scheduling`), never a silently different schedule.

Checked on pytest-xdist 3.8.0 (installed, the newest release) and 3.5.0 (the oldest allowed):
the same private names and shapes (3.5 has ``OrderedDict`` where 3.8 has ``dict``).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import pytest
from xdist import workermanage
from xdist.scheduler import LoadScopeScheduling

from pytest_memeval.compat import installed_version

__all__ = [
    "DSESSION_PLUGIN",
    "SCOPE_HOOKS",
    "SCOPE_STATE",
    "ScopeScheduling",
    "is_xdist_controller",
    "missing_scope_hooks",
    "pending_item_indices",
    "require_scope_scheduling",
    "scheduler_has_pending",
    "worker_specs",
]

#: private: the name xdist registers its controller session (DSession) under, in the
#: controller process only (xdist/plugin.py, 3.5.0-3.8.0).
DSESSION_PLUGIN = "dsession"

#: private: LoadScopeScheduling's hooks we override, with their parameters (3.5.0-3.8.0).
SCOPE_HOOKS: dict[str, tuple[str, ...]] = {
    "_split_scope": ("self", "nodeid"),
    "_assign_work_unit": ("self", "node"),
    "_reschedule": ("self", "node"),
}
#: private: LoadScopeScheduling's state we read and change (set in __init__, 3.5.0-3.8.0).
SCOPE_STATE = ("workqueue", "assigned_work", "registered_collections")

_SUPPORTED = "pytest-xdist 3.5.0 and 3.8.0"


def is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process is an xdist controller (which does not collect itself)."""
    return bool(config.pluginmanager.has_plugin(DSESSION_PLUGIN))


def missing_scope_hooks(base: type = LoadScopeScheduling) -> list[str]:
    """The private hooks of :data:`SCOPE_HOOKS` that ``base`` lacks or has with other
    parameters (empty: the adapter can work)."""
    missing = []
    for name, params in SCOPE_HOOKS.items():
        hook = getattr(base, name, None)
        try:
            found = tuple(inspect.signature(hook).parameters) if callable(hook) else None
        except (TypeError, ValueError):  # pragma: no cover - a builtin or odd callable
            found = None
        if found != params:
            missing.append(f"{name}{'(' + ', '.join(params) + ')'}")
    return missing


def _error(what: str) -> pytest.UsageError:
    return pytest.UsageError(
        f"pytest-memeval: the installed pytest-xdist {installed_version('pytest-xdist')} has no "
        f"LoadScopeScheduling {what}, which scenario scheduling builds on (checked on "
        f"{_SUPPORTED}). Install one the pins allow: pip install 'pytest-xdist>=3.5,<4'."
    )


def require_scope_scheduling() -> None:
    """Stop with a usage error when this pytest-xdist lacks a hook :class:`ScopeScheduling`
    overrides (call it at configure time, before any worker starts)."""
    missing = missing_scope_hooks()
    if missing:
        raise _error(", ".join(missing))


class ScopeScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's ``loadscope`` scheduling with its private hooks and state under public names.

    Override :meth:`scope_of`, :meth:`assign_work` and :meth:`reschedule` (xdist calls them
    through its private ``_split_scope``, ``_assign_work_unit`` and ``_reschedule``), and use
    :attr:`work_queue`, :attr:`assigned` and :attr:`collections` for xdist's ``workqueue``,
    ``assigned_work`` and ``registered_collections``. ``remove_node`` is public (xdist's
    ``Scheduling`` protocol) and is overridden directly.
    """

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        missing = [name for name in SCOPE_STATE if not hasattr(self, name)]
        if missing:
            raise _error("attribute " + ", ".join(missing))

    # -- state (private attributes of LoadScopeScheduling) ---------------------------------

    @property
    def work_queue(self) -> OrderedDict[str, dict[str, bool]]:
        """Scopes not yet sent to a worker, in order: ``{scope: {nodeid: completed}}``."""
        queue: OrderedDict[str, dict[str, bool]] = self.workqueue
        return queue

    @property
    def assigned(self) -> dict[Any, dict[str, dict[str, bool]]]:
        """Per worker node, the scopes sent to it: ``{node: {scope: {nodeid: completed}}}``."""
        work: dict[Any, dict[str, dict[str, bool]]] = self.assigned_work
        return work

    @property
    def collections(self) -> dict[Any, list[str]]:
        """Per worker node whose collection is in, its collected node ids in order."""
        found: dict[Any, list[str]] = self.registered_collections
        return found

    # -- hooks (xdist calls the private names; subclasses override the public ones) --------

    def scope_of(self, nodeid: str) -> str:
        """The scope (the unit one worker runs) of item ``nodeid``; xdist's: its module."""
        return str(super()._split_scope(nodeid))

    def assign_work(self, node: Any) -> None:
        """Send ``node`` work from :attr:`work_queue`; xdist's: one scope."""
        super()._assign_work_unit(node)

    def reschedule(self, node: Any) -> None:
        """Top ``node`` up if it is running low; xdist's: at two pending items."""
        super()._reschedule(node)

    def _split_scope(self, nodeid: str) -> str:
        return self.scope_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        self.assign_work(node)

    def _reschedule(self, node: Any) -> None:
        self.reschedule(node)


def scheduler_has_pending(config: pytest.Config) -> bool | None:
    """Whether xdist's scheduler (whichever ``--dist`` chose) has items sent to workers or
    queued and not finished; ``None`` outside a controller's test loop."""
    # DSession.sched (set in its pytest_runtestloop) and Scheduling.has_pending (xdist's
    # scheduler protocol, scheduler/protocol.py): 3.5.0-3.8.0.
    session = config.pluginmanager.get_plugin(DSESSION_PLUGIN)
    sched = getattr(session, "sched", None)
    pending = getattr(sched, "has_pending", None)
    return bool(pending) if pending is not None else None


def pending_item_indices(config: pytest.Config) -> list[int] | None:
    """Indices (into ``session.items``) of the items xdist has queued on this worker, the one
    it runs now first; ``None`` where that cannot be read (not a worker, or an xdist whose
    internals differ): the caller then turns prefetch off and says so (results unaffected)."""
    # private: xdist.remote.WorkerInteractor.torun (a TestQueue with a lock() context giving
    # its deque) and .nextitem_index; the interactor is registered without a name. Checked
    # on 3.8.0; 3.5.0's torun is a plain queue without lock(): None there.
    for plugin in config.pluginmanager.get_plugins():
        queue = getattr(plugin, "torun", None)
        if queue is None:
            continue
        if not hasattr(queue, "lock") or not hasattr(plugin, "nextitem_index"):
            return None
        try:
            with queue.lock() as items:
                pending = [i for i in items if isinstance(i, int)]
        except Exception:  # a changed xdist internal: reported as None, never a failure
            return None
        nxt = plugin.nextitem_index
        return ([nxt] if isinstance(nxt, int) else []) + pending
    return None


def worker_specs(config: pytest.Config) -> list[str]:
    """The ``--tx`` specs xdist will start workers from (``-n N`` expanded), as strings."""
    # undocumented: xdist.workermanage.parse_tx_spec_config (3.6+), parse_spec_config before
    # (3.5.0). Checked on 3.5.0 and 3.8.0.
    parse = getattr(workermanage, "parse_tx_spec_config", None) or getattr(
        workermanage, "parse_spec_config", None
    )
    if parse is None:
        raise pytest.UsageError(
            f"pytest-memeval: the installed pytest-xdist {installed_version('pytest-xdist')} "
            f"has no parse_tx_spec_config, needed to bind devices (checked on {_SUPPORTED})"
        )
    return [str(spec) for spec in parse(config)]
