"""pytest internals: the rootdir/config-file decision (pytest#8846), the terminal writer, the
file pytest's junitxml plugin writes, and the scenario record carried on a test report (see
the end of this module).

pytest picks its rootdir and config file before plugins add their options (pytest#8846);
``runtime/cmdline.py`` repeats that decision with every option known and, when it differs,
puts the config on the corrected setup. pytest has no public API for either step. Everything
here was checked on pytest 9.0.3 (installed) and 9.2.0 (the newest release): the same
``determine_setup`` signature and the same ``Config`` attributes. pytest 8.x has a
``determine_setup`` without ``override_ini`` that returns three values: :func:`determine_setup`
answers ``None`` there, and pytest's own choice stands (the ``--opt=VALUE`` spelling works).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

__all__ = [
    "CONFIG_INTERNALS",
    "JunitFile",
    "Setup",
    "collect_module_object",
    "determine_setup",
    "drop_report_record",
    "junit_file",
    "line_in_progress",
    "missing_config_internals",
    "report_record",
    "rerun_config_checks",
    "set_config_setup",
    "set_report_record",
]


class Setup(NamedTuple):
    """pytest's setup decision: rootdir, config file, its ini values, config files ignored."""

    rootpath: Path
    inipath: Path | None
    inicfg: Any
    ignored: Sequence[str]


def determine_setup(
    *,
    inifile: str | None,
    override_ini: Sequence[str] | None,
    args: Sequence[str],
    rootdir_cmd_arg: str | None,
    invocation_dir: Path,
) -> Setup | None:
    """pytest's own rootdir/config-file decision for these arguments, or ``None`` when this
    pytest's internal is not the one we know (then no correction is attempted)."""
    # private: _pytest.config.findpaths.determine_setup (keyword-only, returns
    # (rootpath, inipath, inicfg, ignored_config_files)). Checked on pytest 9.0.3 and 9.2.0;
    # pytest 8.0-8.4 take no override_ini and return 3 values (TypeError/length: None).
    try:
        from _pytest.config.findpaths import determine_setup as _determine_setup
    except ImportError:
        return None
    try:
        result = _determine_setup(
            inifile=inifile,
            override_ini=override_ini,
            args=args,
            rootdir_cmd_arg=rootdir_cmd_arg,
            invocation_dir=invocation_dir,
        )
    except TypeError:
        return None
    if not isinstance(result, tuple) or len(result) != 4:
        return None
    rootpath, inipath, inicfg, ignored = result
    return Setup(Path(rootpath), Path(inipath) if inipath is not None else None, inicfg, ignored)


#: private: the Config attributes pytest sets from determine_setup (Config._preparse), and the
#: ini cache and parser. Checked on pytest 9.0.3 and 9.2.0 (``_ignored_config_files`` is
#: optional: pytest 8.x has none).
CONFIG_INTERNALS = ("_rootpath", "_inipath", "_inicfg", "_inicache", "_parser")


def missing_config_internals(config: pytest.Config) -> list[str]:
    """The names of :data:`CONFIG_INTERNALS` this pytest's config lacks (empty: all there)."""
    return [name for name in CONFIG_INTERNALS if not hasattr(config, name)]


def set_config_setup(config: pytest.Config, setup: Setup) -> None:
    """Put ``config`` on ``setup`` as pytest's ``Config._preparse`` does after its own
    ``determine_setup`` call (rootdir, config file, ini values; the ini cache cleared; the
    rootdir/inifile lines of the usage-error text). Call :func:`missing_config_internals`
    first: this raises ``AttributeError`` on a pytest without them."""
    missing = missing_config_internals(config)
    if missing:
        raise AttributeError(f"this pytest's Config has no {', '.join(missing)}")
    # private: Config._rootpath/_inipath/_inicfg/_ignored_config_files/_inicache (9.0.3, 9.2.0)
    config._rootpath = setup.rootpath
    config._inipath = setup.inipath
    config._inicfg = setup.inicfg
    if hasattr(config, "_ignored_config_files"):
        config._ignored_config_files = setup.ignored
    config._inicache.clear()
    # private: Config._parser.extra_info (a dict pytest shows on a usage error; 9.0.3, 9.2.0)
    extra = getattr(config._parser, "extra_info", None)
    if isinstance(extra, dict):
        extra["rootdir"] = str(setup.rootpath)
        extra["inifile"] = str(setup.inipath)


def rerun_config_checks(config: pytest.Config) -> None:
    """Repeat pytest's ``minversion`` and ``required_plugins`` checks on the current ini
    values (each only if this pytest has it)."""
    # private: Config._checkversion, Config._validate_plugins (pytest 9.0.3, 9.2.0)
    for check in ("_checkversion", "_validate_plugins"):
        method = getattr(config, check, None)
        if callable(method):
            method()


def line_in_progress(reporter: Any) -> bool:
    """Whether the terminal reporter's current line already has text (pytest's progress
    dots leave the cursor mid-line without telling ``ensure_newline``). ``False`` when it
    cannot tell."""
    # private: TerminalReporter._tw (its TerminalWriter; width_of_current_line is public on
    # it). Checked on pytest 9.0.3 and 9.2.0.
    writer = getattr(reporter, "_tw", None)
    return bool(getattr(writer, "width_of_current_line", 0))


def collect_module_object(
    session: pytest.Session, module: ModuleType, *, name: str, path: Path
) -> list[pytest.Item]:
    """Collect an already imported module's test functions as if pytest had found its file:
    a :class:`pytest.Module` named ``name`` (its node id too) at ``path`` (whose directory's
    conftest.py files apply to the items), parametrized by ``pytest_generate_tests``, each
    item announced by ``pytest_itemcollected`` and the module by ``pytest_collectreport``
    (the terminal counts the items as collected)."""
    collector = pytest.Module.from_parent(session, path=path, name=name, nodeid=name)
    # The module object is set, not imported from ``path``: importing the plugin's own file
    # by path would put its folder on sys.path (the prepend import mode).
    collector.obj = module
    # undocumented: Session.genitems, the step of Session.perform_collect that expands a
    # collector into items (collect report, parametrization, pytest_itemcollected). Checked
    # on pytest 9.0.3 and 9.2.0.
    return list(session.genitems(collector))


# -- the scenario record on a test report ------------------------------------------------------
#
# undocumented: a scenario's record rides from the worker to the controller as an extra
# attribute of the item's call report. pytest's report serialisation (the
# pytest_report_to_serializable / pytest_report_from_serializable hooks that xdist sends
# reports with) copies every entry of ``report.__dict__`` (_pytest.reports._report_to_json)
# and TestReport(**extra) sets each back as an attribute; a JSON-able dict travels as is.
# Checked on pytest 9.0.3 and 9.2.0 with pytest-xdist 3.5.0 and 3.8.0
# (tests/integration/test_load.py and the -n 2 end-to-end runs fail without it).
# ``report.user_properties`` is documented and serialised too, but pytest's junitxml writes
# each entry there into the XML report as a <property>: every record would land in it.
_RECORD_ATTR = "memeval_record"


def set_report_record(report: pytest.TestReport, record: Mapping[str, Any]) -> None:
    """Attach a scenario record (plain JSON data) to ``report`` for the controller."""
    setattr(report, _RECORD_ATTR, record)


def report_record(report: pytest.TestReport) -> object | None:
    """The record attached by :func:`set_report_record`, or ``None`` (as received: the
    caller checks it is a record)."""
    return getattr(report, _RECORD_ATTR, None)


def drop_report_record(report: pytest.TestReport) -> None:
    """Remove the record from ``report`` (pytest keeps every report to the session's end)."""
    report.__dict__.pop(_RECORD_ATTR, None)


# -- the JUnit XML file pytest writes --------------------------------------------------------


class JunitFile(NamedTuple):
    """The file pytest's junitxml plugin writes in this process, and its family (``xunit1``
    for ``legacy`` too, or ``xunit2``)."""

    path: Path
    family: str


def junit_file(config: pytest.Config) -> JunitFile | None:
    """The JUnit XML file this process writes (``--junitxml``), or ``None`` (no
    ``--junitxml``, an xdist worker, the junitxml plugin disabled with ``-p no:junitxml``)."""
    # private: _pytest.junitxml.xml_key, the stash key of its LogXML, whose ``logfile`` is the
    # path it writes (expanded and made absolute at configure) and ``family`` the schema
    # ("legacy" already mapped to "xunit1"). Checked on pytest 9.0.3 and 9.2.0; without the
    # key, the public option and ini value give the same (LogXML's own normalisation).
    try:
        from _pytest.junitxml import xml_key
    except ImportError:
        pass
    else:
        xml = config.stash.get(xml_key, None)
        if xml is None:
            return None
        logfile, family = getattr(xml, "logfile", None), getattr(xml, "family", None)
        if isinstance(logfile, str) and family in ("xunit1", "xunit2"):
            return JunitFile(Path(logfile), family)
    if not config.pluginmanager.has_plugin("junitxml") or hasattr(config, "workerinput"):
        return None
    value = config.getoption("xmlpath", None)
    if not value:
        return None
    path = os.path.normpath(os.path.abspath(os.path.expanduser(os.path.expandvars(value))))
    family = config.getini("junit_family")
    return JunitFile(Path(path), "xunit1" if family == "legacy" else str(family))
