"""Eval items of the bundled scene-memory benchmark: run with ``pytest --ckpt oracle``.

Each scenario of the profile's benchmark gives ``test_final_query[<id>]`` (m1) and
``test_turns[<id>]`` (m2, xfail where the turn structure is unaligned).
"""

from pytest_memeval.evaluation import test_final_query, test_turns

__all__ = ["test_final_query", "test_turns"]
