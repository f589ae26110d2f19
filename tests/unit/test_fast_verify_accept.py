"""What one row of a verification pass proves, and which continuation it guesses: the
decisions of :func:`~pytest_memeval.decode.fast.verify.accept` and
:class:`~pytest_memeval.decode.fast.answers.AnswerIndex` on hand-made logits summaries (no
model: the pass itself is checked against the reference in
``tests/integration/test_fast_verify.py``)."""

from __future__ import annotations

import pytest

from pytest_memeval.decode.fast import Acceptance, AnswerIndex, Bounds, Checks, accept

STOP = 9
BOUND = 1e-3


def _accept(
    draft: tuple[int, ...],
    guess: list[int],
    best: list[int],
    margins: float | list[float] = 1.0,
    max_new: int = 8,
) -> Acceptance:
    margin = [margins] * len(best) if isinstance(margins, float) else margins
    return accept(
        len(draft),
        guess,
        Checks(best, margin, [10.0] * len(best)),
        bounds=Bounds("float32", margin=BOUND),
        stop=frozenset({STOP}),
        max_new_tokens=max_new,
    )


def test_a_guess_followed_to_its_stop_settles_the_turn() -> None:
    got = _accept((4, 7), [6, STOP], [6, STOP, 3])
    assert got == Acceptance((6, STOP), settled=True, left_guess=False)


def test_the_models_own_stop_settles_the_turn_where_it_leaves_the_guess() -> None:
    got = _accept((4, 7), [6, STOP], [STOP, 2, 3])
    assert got == Acceptance((STOP,), settled=True, left_guess=False)


def test_leaving_the_guess_keeps_the_models_token_and_nothing_after_it() -> None:
    # Position 1 leaves the guess (8, not 6): positions after it saw the wrong token.
    got = _accept((4, 7), [5, 6, STOP], [5, 8, 6, STOP])
    assert got == Acceptance((5, 8), settled=False, left_guess=True)


def test_past_the_end_of_the_guess_the_last_position_decides_one_more_token() -> None:
    got = _accept((4, 7), [5], [5, 6])
    assert got == Acceptance((5, 6), settled=False, left_guess=True)


def test_a_near_tie_stops_before_the_undecided_token() -> None:
    got = _accept((4, 7), [5, 6, STOP], [5, 6, STOP, 0], [1.0, BOUND / 2])
    assert got == Acceptance((5,), settled=False, left_guess=False)
    # Exactly at the bound is trusted (as everywhere in the fast path).
    got = _accept((4, 7), [5, STOP], [5, STOP, 0], [1.0, BOUND, 1.0])
    assert got == Acceptance((5, STOP), settled=True, left_guess=False)


@pytest.mark.parametrize("draft", [(4,), (4, 7), (4, 7, 5)])
def test_the_token_budget_counts_from_the_answer_start(draft: tuple[int, ...]) -> None:
    """max_new_tokens 4: the turn ends at its 4th token, stop or not, as ``generate`` does."""
    guess = [5, 5, 5, 5, STOP][: 4 - len(draft) + 1]
    best = [5] * (len(guess) + 1)
    got = _accept(draft, guess, best, max_new=4)
    assert got.settled and len(draft) + len(got.tokens) == 4


def test_the_guess_is_a_known_answer_starting_with_the_draft_else_the_truths_rest() -> None:
    stop = frozenset({STOP})
    index = AnswerIndex(stop, max_new_tokens=8)
    index.learn([(4, 5, 6, STOP), (4, 7, 1, STOP), (4, 7, 1, STOP), (4, 7, 2, STOP), ()])
    # The most frequent answer starting (4, 7): (4, 7, 1, STOP).
    assert index.guess((4, 7), (4, 5, 6, STOP)) == (1, STOP)
    # No known answer starts (4, 8): the truth from the draft's length on.
    assert index.guess((4, 8), (4, 5, 6, STOP)) == (6, STOP)
    # Nothing after a stop, and no more than the budget can use.
    truth = (4, 5, 6, 7, STOP)
    assert AnswerIndex(stop, max_new_tokens=3).guess((4, 8), truth) == ()
    assert AnswerIndex(stop, max_new_tokens=4).guess((4, 8), truth) == (6,)
