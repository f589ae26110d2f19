"""What one row of a verification pass proves, and which continuation it guesses: the
decisions of :meth:`FastDecoder._accept` and :meth:`FastDecoder._guess` on hand-made logits
summaries (no model: the pass itself is checked against the reference in
``tests/integration/test_fast_verify.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.decode.fast import KINDS, FastDecoder, _Pending, _Plan, _Turn
from pytest_memeval.model.prompts import TurnPrompt

STOP = 9
BOUND = 1e-3


class _Loaded:
    dtype = "float32"


def _decoder(max_new: int = 8) -> FastDecoder:
    # Only the fields _accept/_guess/_trusted read: building a real one loads a model.
    decoder = FastDecoder.__new__(FastDecoder)
    decoder.loaded = _Loaded()  # type: ignore[assignment]
    decoder.max_new_tokens = max_new
    decoder.bounds = dict.fromkeys(KINDS, BOUND)
    decoder.bounds_ulps = dict.fromkeys(KINDS, 0.0)
    decoder._stop = frozenset({STOP})
    decoder._answer_counts = Counter()
    decoder._answers_by_prefix = {}
    return decoder


def _turn(expected: tuple[int, ...]) -> _Turn:
    return _Turn(
        TurnPrompt(message_index=1, ids=(1, 2, 3), target=""), expected, ends_with_stop=True
    )


def _pending(draft: tuple[int, ...], expected: tuple[int, ...] = (4, 5, 6, STOP)) -> _Pending:
    return _Pending(row=0, turn_no=0, turn=_turn(expected), draft=draft, cache=None)


def _accept(
    decoder: FastDecoder, item: _Pending, guess: list[int], best: list[int], margins: Any = 1.0
) -> tuple[list[int], bool, bool]:
    margin = [margins] * len(best) if isinstance(margins, float) else margins
    return decoder._accept(item, guess, best, margin, [10.0] * len(best))


def test_a_guess_followed_to_its_stop_settles_the_turn() -> None:
    got = _accept(_decoder(), _pending((4, 7)), [6, STOP], [6, STOP, 3])
    assert got == ([6, STOP], True, False)


def test_the_models_own_stop_settles_the_turn_where_it_leaves_the_guess() -> None:
    got = _accept(_decoder(), _pending((4, 7)), [6, STOP], [STOP, 2, 3])
    assert got == ([STOP], True, False)


def test_leaving_the_guess_keeps_the_models_token_and_nothing_after_it() -> None:
    # Position 1 leaves the guess (8, not 6): positions after it saw the wrong token.
    got = _accept(_decoder(), _pending((4, 7)), [5, 6, STOP], [5, 8, 6, STOP])
    assert got == ([5, 8], False, True)


def test_past_the_end_of_the_guess_the_last_position_decides_one_more_token() -> None:
    got = _accept(_decoder(), _pending((4, 7)), [5], [5, 6])
    assert got == ([5, 6], False, True)


def test_a_near_tie_stops_before_the_undecided_token() -> None:
    got = _accept(_decoder(), _pending((4, 7)), [5, 6, STOP], [5, 6, STOP, 0], [1.0, BOUND / 2])
    assert got == ([5], False, False)
    # Exactly at the bound is trusted (as everywhere in the fast path).
    got = _accept(_decoder(), _pending((4, 7)), [5, STOP], [5, STOP, 0], [1.0, BOUND, 1.0])
    assert got == ([5, STOP], True, False)


@pytest.mark.parametrize("draft", [(4,), (4, 7), (4, 7, 5)])
def test_the_token_budget_counts_from_the_answer_start(draft: tuple[int, ...]) -> None:
    """max_new_tokens 4: the turn ends at its 4th token, stop or not, as ``generate`` does."""
    guess = [5, 5, 5, 5, STOP][: 4 - len(draft) + 1]
    best = [5] * (len(guess) + 1)
    accepted, settled, _ = _accept(_decoder(max_new=4), _pending(draft), guess, best)
    assert settled and len(draft) + len(accepted) == 4


def test_the_guess_is_a_known_answer_starting_with_the_draft_else_the_truths_rest() -> None:
    decoder = _decoder()
    plan = _Plan(
        Scenario.__new__(Scenario),
        [],
        [
            _turn((4, 5, 6, STOP)),
            _turn((4, 7, 1, STOP)),
            _turn((4, 7, 1, STOP)),
            _turn((4, 7, 2, STOP)),
        ],
    )
    decoder._learn_answers(plan)
    # The most frequent answer starting (4, 7): (4, 7, 1, STOP).
    assert decoder._guess(_pending((4, 7))) == (1, STOP)
    # No known answer starts (4, 8): the truth from the draft's length on.
    assert decoder._guess(_pending((4, 8))) == (6, STOP)
    # Nothing after a stop, and no more than the budget can use.
    assert _decoder(max_new=3)._guess(_pending((4, 8), (4, 5, 6, 7, STOP))) == ()
    assert _decoder(max_new=4)._guess(_pending((4, 8), (4, 5, 6, 7, STOP))) == (6,)
