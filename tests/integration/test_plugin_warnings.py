"""Installing the plugin adds no warning to a user's plain pytest run.

pytest warns ``PytestAssertRewriteWarning: Module already imported so cannot be rewritten``
for a ``pytest_plugins`` entry that was imported before pytest read the list (plugin.py
imports several of its own plugin modules); the modules opt out with PYTEST_DONT_REWRITE.
With the editable install CI uses, pytest does not mark the package for rewriting up front,
which is when the warning shows.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_a_plain_run_has_no_plugin_warning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_ok():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-W", "error::pytest.PytestAssertRewriteWarning", "-q")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert result.parseoutcomes() == {"passed": 1}


@pytest.mark.slow
def test_every_listed_plugin_module_is_registered(pytester: pytest.Pytester) -> None:
    from pytest_memeval import plugin

    pytester.makeconftest(
        "def pytest_configure(config):\n"
        "    names = " + repr(list(plugin.pytest_plugins)) + "\n"
        "    missing = [n for n in names if not config.pluginmanager.has_plugin(n)]\n"
        "    assert not missing, missing\n"
    )
    pytester.makepyfile(test_user="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-q")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
