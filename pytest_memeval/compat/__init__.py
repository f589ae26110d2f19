"""Every use of another package's private or undocumented API, behind one small typed seam.

This is the bottom layer: it imports nothing else from ``pytest_memeval``, and the rest of the
package reaches a third-party internal only through it. Each helper names the private name it
uses and the versions it was checked on, and either falls back (the feature it speeds up or
corrects is skipped, results unchanged) or stops with a clear error naming the package, the
installed version and the supported range. ``tox -e newest`` (and the ``newest`` step of
``.ci/run``) runs the tests against the newest releases the pins in ``pyproject.toml`` allow.

- :mod:`~pytest_memeval.compat.pytest`: pytest's rootdir/config-file decision
  (``_pytest.config.findpaths.determine_setup``) and the ``Config`` attributes it sets
  (``_rootpath``, ``_inipath``, ``_inicfg``, ``_inicache``, ``_ignored_config_files``,
  ``_parser.extra_info``, ``_checkversion``, ``_validate_plugins``), for the pytest#8846
  workaround in ``runtime/cmdline.py``; the terminal reporter's ``_tw``; the JUnit XML file
  junitxml writes (``_pytest.junitxml.xml_key``: its ``logfile`` and ``family``, for the
  test-suite properties of ``tools/publish/junit.py``); the scenario record carried on a test report
  (``set_report_record``/``report_record``: pytest's report serialisation copies
  ``report.__dict__``, undocumented).
- :mod:`~pytest_memeval.compat.xdist`: :class:`~pytest_memeval.compat.xdist.ScopeScheduling`,
  xdist's ``LoadScopeScheduling`` with its private hooks (``_split_scope``,
  ``_assign_work_unit``, ``_reschedule``) and state (``workqueue``, ``assigned_work``,
  ``registered_collections``) under public, typed names; the worker loop's queue (``torun``,
  ``nextitem_index``); the controller's ``"dsession"`` plugin name; ``parse_tx_spec_config``.
- :mod:`~pytest_memeval.compat.syrupy`: ``SingleFileSnapshotExtension._write_mode``,
  ``_sanitize_filename`` and ``_max_stem_length``; the ``disable_unused_snapshots`` option dest.
- :mod:`~pytest_memeval.compat.transformers`: ``_compile_jinja_template``; the
  ``DynamicCache``/``DynamicLayer`` layout (``cache.layers``, ``layer.keys``/``values``); the
  cache's argument and output-attribute names (``cache`` in transformers 5,
  ``past_key_values`` before) and ``forward``'s optional arguments, behind typed results of a
  forward pass and of ``generate`` with its logits. transformers is imported inside the
  functions only (heavy: seconds).
- :mod:`~pytest_memeval.compat.textworld_express`: the JVM process on
  ``TextWorldExpressEnv._gateway.java_process``, so that closing an environment waits for its
  JVM to exit (and ends it if it does not).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["installed_version"]


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (for error messages), or ``"unknown"``."""
    try:
        return version(distribution)
    except PackageNotFoundError:  # pragma: no cover - a vendored or renamed copy
        return "unknown"
