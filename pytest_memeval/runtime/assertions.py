"""The eval items' verdicts: a scenario record -> pass, a :class:`WrongAnswer`, or an xfail.

m1 is an assertion on the final answer; m2 asserts every aligned turn and is an xfail where the
turn structure is unaligned with ``memory_chain``. The public :mod:`pytest_memeval.evaluation`
re-exports these for users who write their own eval items.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.formatting import shorten, shown_list
from pytest_memeval.core.records import Record

__all__ = ["WrongAnswer", "check_final_query", "check_turns"]

#: Longest expected/predicted text shown in a one-line summary (the record has it all).
_SHOWN = 80


class WrongAnswer(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """An eval item failed because the model answered wrong (not because anything broke).

    ``compact`` is the one-line form (scenario, expected, predicted) that the terminal shows
    by default (:mod:`pytest_memeval.runtime.failures`); the message is the full report.
    """

    def __init__(self, msg: str, compact: str) -> None:
        super().__init__(msg, pytrace=False)
        self.compact = compact


# Shown as "WrongAnswer: ..." in pytest's summaries, as pytest shows its own "Failed: ...".
WrongAnswer.__module__ = "builtins"


def _short(text: Any) -> str:
    return shorten(repr(text), _SHOWN)


def check_final_query(record: Record) -> None:
    """Assert the final answer matched; the message shows truth, prediction and prompt end."""
    if record["final_match"]:
        return
    tail = record.get("prompt_tail", "")
    if record["parse_fail"]:
        what = f"PARSE FAILURE ({record['parse_fail_reason']}): output {record['final_pred']!r}"
        short = (
            f"PARSE FAILURE ({record['parse_fail_reason']}): output "
            f"{_short(record['final_pred'])}, expected {_short(record['final_gt'])}"
        )
    else:
        what = f"expected {record['final_gt']!r}, predicted {record['final_pred']!r}"
        short = f"expected {_short(record['final_gt'])}, predicted {_short(record['final_pred'])}"
    raise WrongAnswer(
        f"scenario {record['id']}: final query {what}\n  prompt ends: ...{tail}",
        # repr keeps the line one line whatever the id holds (a newline, a tab).
        compact=f"scenario {record['id']!r}: final query {short}",
    )


def check_turns(record: Record, scenario: Scenario | None = None) -> None:
    """Assert every aligned turn matched; xfail (with the reason) where unaligned."""
    if not record["aligned"]:
        pytest.xfail(
            f"turn structure unaligned with ground truth: {record['n_turns']} turns vs "
            f"{record['n_memory_chain']} memory_chain entries; m2 skips this scenario"
        )
    wrong = [t for t in record["turns"] if t["match"] is False]
    if not wrong:
        return
    lines = shown_list(
        (
            f"turn {t['index']}: expected {t['gt']!r}, predicted {t['pred']!r}"
            + (" (parse failure)" if t["parse_fail"] else "")
            for t in wrong
        ),
        sep="\n  ",
    )
    first = wrong[0]
    raise WrongAnswer(
        f"scenario {record['id']}: {len(wrong)}/{len(record['turns'])} turns wrong\n  {lines}",
        compact=f"scenario {record['id']!r}: {len(wrong)}/{len(record['turns'])} turns wrong; "
        f"turn {first['index']}: expected {_short(first['gt'])}, predicted "
        f"{_short(first['pred'])}" + (" (parse failure)" if first["parse_fail"] else ""),
    )
