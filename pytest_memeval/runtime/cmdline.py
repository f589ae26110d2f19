"""Options written the way people type them: ``--memeval-out DIR`` as well as ``--memeval-out=DIR``.

pytest picks the rootdir and the config file (``pyproject.toml``, ``pytest.ini``...) from the
command line's *path* arguments, and it does so before any installed plugin has added its
options (pytest#8846, a known limitation). In that first pass ``--memeval-out /data/runs/x``
is an unknown option followed by a path: once ``/data/runs/x`` exists (a second run, or an
xdist worker started after the controller created it) pytest takes it for a test path and
settles on a rootdir near it, with no config file. The user's ``addopts``, ``memeval_*`` ini
keys and profiles are then silently gone. The ``=`` spelling does not have the problem, and
users copy commands from shell history, CI configs and Slurm scripts, so both must work.

:func:`pytest_load_initial_conftests` runs right after the plugins are loaded, before the
initial conftests and before pytest parses the command line for real. It repeats pytest's own
rootdir/config-file decision with every option known (the same ``determine_setup`` call on the
same arguments); when that differs from what pytest chose, it puts pytest's config on the
corrected setup: rootdir, config file, ini values, ``addopts`` (taken from the right file),
``confcutdir``, ``pythonpath`` and the ``minversion``/``required_plugins`` checks. It is
applied to every option of every plugin, not only ours (``--html DIR`` has the same problem).
Every pytest internal this needs is reached through :mod:`pytest_memeval.compat.pytest`. On a
pytest whose ``determine_setup`` is not the one we know (8.x) pytest's own choice stands; if
the config internals it would change are not there, the run stops with a usage error that
says what happened and how to spell the option instead of running with the wrong config.

xdist workers go through the same start-up (same arguments, same working directory), so they
are corrected the same way; the controller additionally hands them its rootdir and config
file and each worker checks it ended up with the same (``plugin.pytest_configure``).

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import copy
import os
import shlex
import sys
from pathlib import Path

import pytest

from pytest_memeval.compat.pytest import (
    Setup,
    determine_setup,
    missing_config_internals,
    rerun_config_checks,
    set_config_setup,
)

__all__ = ["SETUP_NOTE_KEY", "check_worker_setup", "setup_note"]

#: What was corrected (for the report header), when something was.
SETUP_NOTE_KEY = pytest.StashKey[str]()


def _base_args(config: pytest.Config) -> list[str] | None:
    """The arguments pytest determined its setup from: ``PYTEST_ADDOPTS`` + the command line."""
    raw = config.invocation_params.args
    if raw is None:  # pragma: no cover - pytest always records them
        return None
    env = os.environ.get("PYTEST_ADDOPTS", "")
    return shlex.split(env) + [str(a) for a in raw]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, args: list[str], parser: pytest.Parser
) -> None:
    config = early_config
    base = _base_args(config)
    if base is None:
        return
    known = config.known_args_namespace
    if getattr(known, "help", False) or getattr(known, "version", False):
        return
    # No except here: parse_known_args is public API and inifilename/override_ini/
    # file_or_dir/rootdir are the dests of pytest's own -c/-o/args/--rootdir options;
    # compat.pytest.determine_setup answers None for a pytest whose internal differs. An
    # error here is a bug, and must not silently drop the rootdir correction.
    ns = parser.parse_known_args(base, namespace=copy.copy(config.option))
    setup = determine_setup(
        inifile=ns.inifilename,
        override_ini=ns.override_ini,
        args=ns.file_or_dir,
        rootdir_cmd_arg=ns.rootdir or None,
        invocation_dir=config.invocation_params.dir,
    )
    if setup is None:  # a pytest whose internal we do not know: its own choice stands
        return
    rootpath, inipath = setup.rootpath, setup.inipath
    if rootpath == config.rootpath and inipath == config.inipath:
        return
    # Arguments pytest took for test paths in its first pass, but which are option values.
    wrongly = _wrong_path_args(base, [str(a) for a in ns.file_or_dir or []])
    what = ", ".join(wrongly) if wrongly else "an option's value"
    was = f"rootdir {config.rootpath}, config file {config.inipath or 'none'}"
    now = f"rootdir {rootpath}, config file {inipath or 'none'}"
    try:
        kept = _apply_setup(config, args, base, parser, setup)
    except _CannotFix as exc:
        raise pytest.UsageError(
            f"pytest took {what} for a test path before it knew the option that value "
            f"belongs to, and chose {was} instead of {now}; pytest-memeval could not "
            f"correct that ({exc}). Write the option with '=' (e.g. --memeval-out=DIR)."
        ) from None
    config.stash[SETUP_NOTE_KEY] = (
        f"memeval: corrected pytest's setup to {now} (pytest had taken {what} for a test "
        f"path and chosen {was})"
        + (f"; plugins its addopts loaded stay loaded: {', '.join(kept)}" if kept else "")
    )


def _wrong_path_args(base: list[str], real_paths: list[str]) -> list[str]:
    """Non-option arguments that exist on disk but are not among the real path arguments."""
    out = []
    for arg in base:
        if arg.startswith("-") or arg in real_paths:
            continue
        try:
            if Path(arg.split("::")[0]).exists():
                out.append(arg)
        except OSError:  # pragma: no cover - a name the OS rejects
            continue
    return out


class _CannotFix(Exception):
    pass


def _apply_setup(
    config: pytest.Config,
    args: list[str],
    base: list[str],
    parser: pytest.Parser,
    setup: Setup,
) -> list[str]:
    """Put ``config`` on the corrected setup (pytest internals, through ``compat.pytest``:
    every one is checked first).

    Returns the plugins the wrong file's addopts loaded (``-p NAME``), which stay loaded."""
    rootpath, inipath = setup.rootpath, setup.inipath
    missing = missing_config_internals(config)
    if missing:
        raise _CannotFix(f"this pytest has no {', '.join(missing)}")
    old_addopts = [str(a) for a in config.getini("addopts")]
    given = [str(a) for a in args]
    if given == old_addopts + base:
        with_addopts = True
    elif given == base:
        with_addopts = False
    else:
        raise _CannotFix("the argument list is not what pytest 9 builds")
    blocked = _plugin_args(old_addopts, blocking=True)
    if blocked:
        # pytest has already unregistered those plugins; that cannot be undone here.
        raise _CannotFix(
            f"the wrong config file {config.inipath} has addopts {' '.join(old_addopts)!r}, "
            "which pytest already applied"
        )
    # `-p name` from the wrong file: the plugin stays loaded (it may also be loaded for good
    # reasons, e.g. as an installed plugin; unregistering could remove it); the note says so.
    kept = _plugin_args(old_addopts, blocking=False)
    old_pythonpath = [str(p) for p in config.getini("pythonpath")]

    ns_confcutdir = parser.parse_known_args(base, namespace=copy.copy(config.option)).confcutdir
    set_config_setup(config, setup)

    new_addopts = [str(a) for a in config.getini("addopts")] if with_addopts else []
    args[:] = new_addopts + base
    config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(config.option))
    if ns_confcutdir is None:
        config.known_args_namespace.confcutdir = str(
            inipath.parent if inipath is not None else rootpath
        )
    if new_addopts:
        # `-p name` / `-p no:name` in the right file's addopts (pytest handled the wrong one's).
        config.pluginmanager.consider_preparse(new_addopts, exclude_only=False)
    # The wrong file's pythonpath entries are not ours to keep; the right file's are added
    # (pytest's own clean-up removes getini("pythonpath"), i.e. these, at the end).
    for entry in old_pythonpath:
        if entry in sys.path:
            sys.path.remove(entry)
    for entry in reversed([str(p) for p in config.getini("pythonpath")]):
        sys.path.insert(0, entry)
    rerun_config_checks(config)
    return kept


def _plugin_args(addopts: list[str], *, blocking: bool) -> list[str]:
    """The plugin names of ``-p NAME`` / ``-pNAME`` in ``addopts`` that block (``no:``) or
    load plugins."""
    names: list[str] = []
    for i, arg in enumerate(addopts):
        if arg == "-p" and i + 1 < len(addopts):
            name = addopts[i + 1]
        elif arg.startswith("-p") and len(arg) > 2:
            name = arg[2:].lstrip("=")
        else:
            continue
        if name.startswith("no:") == blocking:
            names.append(name)
    return names


def setup_note(config: pytest.Config) -> str | None:
    """The header line saying the setup was corrected, if it was."""
    return config.stash.get(SETUP_NOTE_KEY, None)


def check_worker_setup(config: pytest.Config, rootdir: str, inifile: str | None) -> None:
    """An xdist worker must have the controller's rootdir and config file; say so if not."""
    mine = (str(config.rootpath), str(config.inipath) if config.inipath else None)
    if mine != (rootdir, inifile):
        raise pytest.UsageError(
            f"this xdist worker chose rootdir {mine[0]} and config file {mine[1] or 'none'}, "
            f"the controller rootdir {rootdir} and config file {inifile or 'none'} (an option "
            "value taken for a test path?). Write path options with '=' (--memeval-out=DIR) "
            "or pass --rootdir and -c explicitly."
        )
