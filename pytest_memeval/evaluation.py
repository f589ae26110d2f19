"""The standard eval items. Import them into a test module to evaluate a profile::

    # contracts/test_eval.py
    from pytest_memeval.evaluation import test_final_query, test_turns  # noqa: F401

The plugin parametrizes them over the scenarios of the ``--ckpt`` profile, so each scenario
gives ``test_final_query[<id>]`` (m1, an assertion) and ``test_turns[<id>]`` (m2; an xfail
where the turn structure is unaligned with ``memory_chain``).
"""

from __future__ import annotations

from pytest_memeval.core.records import Record
from pytest_memeval.runtime.assertions import WrongAnswer, check_final_query, check_turns

__all__ = ["WrongAnswer", "check_final_query", "check_turns", "test_final_query", "test_turns"]


def test_final_query(memeval_record: Record) -> None:
    """m1: the final answer about the scene must match."""
    check_final_query(memeval_record)


def test_turns(memeval_record: Record) -> None:
    """m2: every aligned turn must match; unaligned scenarios are an xfail."""
    check_turns(memeval_record)
