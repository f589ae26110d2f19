"""The matching rule and parse failures."""

from __future__ import annotations

import pytest

from pytest_memeval.core.matching import ParseRules, match_output, normalize


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("  Fridge \n", "fridge"),
        ("pick  MUG\tfrom counter", "pick mug from counter"),
        ("cabinet_left", "cabinet_left"),
        ("Stra\u00dfe", "strasse"),  # casefold, not lower
        ("e\u0301", "\u00e9"),  # NFC
    ],
)
def test_normalize(raw: str, norm: str) -> None:
    assert normalize(raw) == norm


def test_punctuation_and_underscores_are_significant() -> None:
    assert normalize("cabinet_left") != normalize("cabinet left")
    assert normalize("yes.") != normalize("yes")


def test_match_and_mismatch() -> None:
    rules = ParseRules()
    assert match_output(" Fridge", "fridge", stopped=True, kind="final", rules=rules).match
    wrong = match_output("sink", "fridge", stopped=True, kind="final", rules=rules)
    assert not wrong.match and not wrong.parse_fail


def test_cut_off_and_empty_outputs_are_parse_failures_not_matches() -> None:
    rules = ParseRules()
    cut = match_output("fridge", "fridge", stopped=False, kind="final", rules=rules)
    assert cut.parse_fail and not cut.match and "max_new_tokens" in (cut.reason or "")
    empty = match_output("  ", "fridge", stopped=True, kind="final", rules=rules)
    assert empty.parse_fail and empty.reason == "empty output"


def test_patterns_per_kind() -> None:
    rules = ParseRules(final="yes|no|[a-z_]+", turn="(pick|place|open|close) .+")
    assert (
        match_output("open fridge", None, stopped=True, kind="turn", rules=rules).parse_fail
        is False
    )
    bad = match_output("fly away", "x", stopped=True, kind="turn", rules=rules)
    assert bad.parse_fail and "turn pattern" in (bad.reason or "")
    assert not match_output("cabinet left", "x", stopped=True, kind="final", rules=rules).match
    assert match_output("cabinet left", "x", stopped=True, kind="final", rules=rules).parse_fail


def test_unaligned_turn_never_matches_but_can_fail_to_parse() -> None:
    rules = ParseRules()
    assert match_output("pick mug", None, stopped=True, kind="turn", rules=rules).match is False
    assert match_output("", None, stopped=True, kind="turn", rules=rules).parse_fail
