"""The one wording for lists, throughputs and rates in messages (pytest_memeval.core.formatting)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_memeval.core.formatting import (
    ELLIPSIS,
    SHOWN,
    per_second,
    percent,
    score_text,
    shorten,
    shown_ids,
    shown_list,
)


def test_a_short_list_is_shown_whole() -> None:
    assert shown_list(["s1", "s2", "s3"]) == "s1, s2, s3"
    assert shown_list(["only"]) == "only"
    assert shown_list(iter(["a", "b"])) == "a, b"  # any iterable, consumed once


def test_an_empty_list_says_none() -> None:
    assert shown_list([]) == "none"


def test_a_long_list_shows_the_limit_and_counts_the_rest() -> None:
    ids = [f"s{i}" for i in range(SHOWN + 5)]
    assert shown_list(ids) == ", ".join(ids[:SHOWN]) + ", and 5 more"
    assert shown_list(ids[:SHOWN]) == ", ".join(ids[:SHOWN])  # exactly the limit: no "more"
    assert shown_list(ids[: SHOWN + 1]).endswith(f"s{SHOWN - 1}, and 1 more")


def test_limit_and_separator() -> None:
    assert shown_list(["a", "b", "c", "d"], 2) == "a, b, and 2 more"
    assert shown_list(["x is off", "y is off", "z is off"], 2, sep="; ") == (
        "x is off; y is off; and 1 more"
    )
    with pytest.raises(ValueError, match="limit must be >= 1"):
        shown_list(["a"], 0)


@given(st.lists(st.text(alphabet="abc, ", min_size=1), max_size=30), st.integers(1, 12))
def test_every_item_is_shown_or_counted(items: list[str], limit: int) -> None:
    text = shown_list(items, limit)
    shown = min(len(items), limit)
    assert text.startswith(", ".join(items[:shown]) if items else "none")
    if len(items) > limit:
        assert text.endswith(f", and {len(items) - limit} more")
    else:
        assert text == (", ".join(items) if items else "none")


def test_shown_ids_quote_each_id_and_count_the_rest() -> None:
    assert shown_ids(["s1", "a, b", "it's"]) == "'s1', 'a, b', \"it's\""
    assert shown_ids([]) == "none"
    ids = [f"s{i}" for i in range(SHOWN + 2)]
    assert shown_ids(ids) == ", ".join(repr(i) for i in ids[:SHOWN]) + ", and 2 more"
    assert shown_ids(iter(["x", "y", "z"]), 1) == "'x', and 2 more"


def test_shorten_cuts_to_the_limit_with_one_ellipsis() -> None:
    assert shorten("abcdef", 6) == "abcdef"  # exactly the limit: whole
    assert shorten("abcdefg", 6) == "abcde" + ELLIPSIS
    assert len(shorten("x" * 500, 40)) == 40
    assert shorten("", 1) == ""
    with pytest.raises(ValueError, match="limit must be >= 1"):
        shorten("abc", 0)


@given(st.text(max_size=200), st.integers(1, 100))
def test_shorten_keeps_a_prefix_within_the_limit(text: str, limit: int) -> None:
    short = shorten(text, limit)
    assert len(short) <= limit
    if len(text) <= limit:
        assert short == text
    else:
        assert short.endswith(ELLIPSIS) and text.startswith(short[:-1])


@pytest.mark.parametrize(
    ("rate", "text"),
    [(0.8449, "0.84 scenarios/s"), (12.0, "12.00 scenarios/s"), (0.0, "0.00 scenarios/s")],
)
def test_per_second(rate: float, text: str) -> None:
    assert per_second(rate) == text


def test_per_second_other_units() -> None:
    assert per_second(3.14159, "tokens") == "3.14 tokens/s"


def test_percent_and_score_text() -> None:
    assert percent(0.88359) == "88.36%"
    assert percent(1.0) == "100.00%"
    assert percent(0.196, decimals=1) == "19.6%"  # a share: progress, hand-offs
    assert percent(0.4, 1) == "40.0%"
    assert score_text(167, 189, 167 / 189) == "167/189 = 88.36%"
    assert score_text(0, 0, None) == "0/0 = n/a"
