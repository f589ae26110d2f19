"""Answer matching and parse failures.

The one rule, documented in docs/benchmark-format.md ("Matching"):

* ``normalize(text)``: Unicode NFC, surrounding whitespace stripped, every internal run of
  whitespace collapsed to one space, then ``str.casefold()``. Nothing else: punctuation,
  articles and underscores are significant.
* An output is a *parse failure* when the decoder stopped at ``max_new_tokens`` without
  emitting the stop token (the answer was cut off), when it is empty after normalisation, or
  when the profile sets a ``parse`` pattern for its kind (``final`` or ``turn``) and the
  normalised output does not fully match it. A parse failure never matches, and is counted
  separately from wrong answers.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["MatchResult", "ParseRules", "match_output", "normalize"]

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Normalise an answer for comparison (see the module docstring for the exact rule)."""
    return _WS.sub(" ", unicodedata.normalize("NFC", text).strip()).casefold()


@dataclass(frozen=True)
class ParseRules:
    """Optional full-match patterns a well-formed output must satisfy, per output kind."""

    final: str | None = None
    turn: str | None = None

    def pattern(self, kind: str) -> re.Pattern[str] | None:
        source = self.final if kind == "final" else self.turn
        return re.compile(source) if source else None


@dataclass(frozen=True)
class MatchResult:
    match: bool
    parse_fail: bool
    reason: str | None = None


def match_output(
    pred: str, gt: str | None, *, stopped: bool | None, kind: str, rules: ParseRules
) -> MatchResult:
    """Score one output. ``gt=None`` (unaligned turn) still detects parse failures.

    ``stopped=None`` (unknown: replayed predictions without stop flags) is not a cut-off:
    the harness that produced the output decided where it ended.
    """
    norm = normalize(pred)
    reason: str | None = None
    if stopped is False:
        reason = "no stop token within max_new_tokens (output cut off)"
    elif not norm:
        reason = "empty output"
    else:
        pattern = rules.pattern(kind)
        if pattern is not None and pattern.fullmatch(norm) is None:
            reason = f"does not match the {kind} pattern {pattern.pattern!r}"
    if reason is not None:
        return MatchResult(match=False, parse_fail=True, reason=reason)
    return MatchResult(match=gt is not None and norm == normalize(gt), parse_fail=False)
