"""The byte-guard items (public): model-free contracts that run in a plain ``pytest``.

Import them into a test module of your project::

    # contracts/test_guards.py
    from pytest_memeval.guard_tests import (  # noqa: F401
        test_prompt_prefix,
        test_prompt_tokens,
        test_record_snapshot,
        test_reference_bytes,
        test_reference_file,
        test_scenario_order,
    )

The items and their hooks live in :mod:`pytest_memeval.guards.items`; docs/guards.md says what
each one checks and how to declare the guarded data in ``pyproject.toml``.
"""

from __future__ import annotations

from pytest_memeval.guards.items import (
    test_prompt_prefix,
    test_prompt_tokens,
    test_record_snapshot,
    test_reference_bytes,
    test_reference_file,
    test_scenario_order,
)

__all__ = [
    "test_prompt_prefix",
    "test_prompt_tokens",
    "test_record_snapshot",
    "test_reference_bytes",
    "test_reference_file",
    "test_scenario_order",
]
