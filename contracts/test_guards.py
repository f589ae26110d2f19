"""Byte guards of the bundled benchmark: model-free, they run in a plain ``pytest``.

The variants and what each guards are the ``[tool.memeval.guards.*]`` tables in
pyproject.toml. After an intended change of the data, the builder or the chat template,
re-record the snapshots with ``pytest contracts/test_guards.py --snapshot-update``.
"""

from pytest_memeval.guard_tests import (
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
