"""``--memeval-stall-timeout``: its value, and the one message a stopped run prints."""

from __future__ import annotations

import pytest

from pytest_memeval.runtime.stall import StallWatch, describe_stall


def test_the_message_names_each_worker_its_items_and_the_journal() -> None:
    message = describe_stall(
        600,
        {"gw1": ["test_eval.py::test_turns[b]"], "gw0": ["test_eval.py::test_final_query[a]"]},
        ["gw2"],
        "/runs/demo/subsets/T/journal.jsonl",
    )
    assert message.startswith("pytest-memeval: no worker has reported anything for 600 s")
    assert "gw0 holds 'test_eval.py::test_final_query[a]'; gw1 holds" in message
    assert "gw2 still starting" in message
    assert "kept in /runs/demo/subsets/T/journal.jsonl: rerun with --memeval-resume" in message


def test_without_a_journal_the_message_says_nothing_was_evaluated() -> None:
    message = describe_stall(5, {"gw0": ["x::test_turns[a]"]}, [], None)
    assert "nothing had finished; nothing was evaluated" in message


def test_time_runs_only_while_items_are_outstanding() -> None:
    holding: dict[str, list[str]] = {}
    watch = StallWatch(5, lambda: holding, lambda: None)
    assert not any(watch.held_items().values())  # starting: nothing outstanding
    holding["gw0"] = ["x::test_turns[a]"]
    assert watch.held_items() == {"gw0": ["x::test_turns[a]"]}


def test_another_dist_is_watched_through_xdists_own_pending_flag() -> None:
    watch = StallWatch(5, dict, lambda: None, pending=lambda: True)
    assert watch.held_items() == {"xdist's scheduler": ["items sent, none started"]}
    watch.pytest_runtest_logstart("m.py::test_a")
    assert watch.held_items() == {"xdist's scheduler": ["m.py::test_a"]}


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_value_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("-p", "no:xdist", f"--memeval-stall-timeout={value}", "--ckpt", "x")
    assert result.ret != 0
