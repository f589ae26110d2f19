"""The verification pass's guesses: answers seen so far, by the prefixes they start with.

A turn where the model left the truth usually says another answer of the benchmark (one
that starts as its draft does), or its truth with one word changed. :class:`AnswerIndex`
learns the truths of the scenarios decoded so far and guesses a draft's continuation from
them; the verification pass (``verify.py``) accepts nothing the model does not produce.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

__all__ = ["AnswerIndex"]


class AnswerIndex:
    """The answers seen (truth token sequences), by the prefixes they start with: the
    guesses of the verification pass. A turn that left its truth often says another answer
    of the benchmark that starts as its draft does, or its truth with one word changed."""

    def __init__(self, stop: frozenset[int], max_new_tokens: int) -> None:
        self.stop = stop
        self.max_new_tokens = max_new_tokens
        self._counts: Counter[tuple[int, ...]] = Counter()
        self._by_prefix: dict[tuple[int, ...], set[tuple[int, ...]]] = {}

    def learn(self, answers: Iterable[tuple[int, ...]]) -> None:
        """Count ``answers`` (empty ones: no truth, skipped)."""
        for answer in answers:
            if not answer:
                continue
            if answer not in self._counts:
                for length in range(1, len(answer)):
                    self._by_prefix.setdefault(answer[:length], set()).add(answer)
            self._counts[answer] += 1

    def guess(self, draft: tuple[int, ...], truth: tuple[int, ...]) -> tuple[int, ...]:
        """The guessed continuation of ``draft``: the most frequent known answer that starts
        with it, else ``truth`` from the draft's length on; cut after a stop id and to the
        token budget. Only a guess: the pass accepts nothing the model does not produce."""
        known = self._by_prefix.get(draft)
        if known:
            best = max(known, key=lambda a: (self._counts[a], a))
            guess = best[len(draft) :]
        else:
            guess = truth[len(draft) :]
        # Position i of the pass decides answer token len(draft) + i: the last useful one is
        # the max_new_tokens-th, so at most max_new_tokens - len(draft) - 1 guessed tokens.
        guess = guess[: max(0, self.max_new_tokens - len(draft) - 1)]
        stop = next((k + 1 for k, t in enumerate(guess) if t in self.stop), len(guess))
        return guess[:stop]
