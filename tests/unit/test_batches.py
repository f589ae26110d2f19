"""Batch composition of the fast path's forward passes (decode/batches.py): similar lengths
share a batch, within the row and padded-token limits; the later batched calls in equal
shares."""

from __future__ import annotations

import random

import pytest

from pytest_memeval.decode.batches import even_batches, length_batches, padded_tokens


def test_longest_first_and_consecutive_lengths_share_a_batch() -> None:
    lengths = [5, 40, 7, 38, 6, 41]
    batches = length_batches(lengths, 2, 10_000)
    assert batches == [[5, 1], [3, 2], [4, 0]]
    assert [[lengths[i] for i in b] for b in batches] == [[41, 40], [38, 7], [6, 5]]


def test_ties_keep_the_input_order_and_every_index_appears_once() -> None:
    lengths = [3, 9, 3, 9, 3]
    batches = length_batches(lengths, 3, 10_000)
    assert batches == [[1, 3, 0], [2, 4]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))


def test_padded_tokens_bound_a_batch_but_a_long_row_still_gets_one() -> None:
    lengths = [100, 60, 60, 60, 500]
    batches = length_batches(lengths, 8, 200)
    # 500 alone exceeds the bound: it still runs, alone; 100 + 60 fit (2 x 100), a third does
    # not (3 x 100 > 200); the remaining 60s fit three to a batch (3 x 60 = 180).
    assert batches == [[4], [0, 1], [2, 3]]
    assert all(len(b) * max(lengths[i] for i in b) <= 200 for b in batches if len(b) > 1)


def test_min_fill_starts_a_new_batch_before_padding_outweighs_the_rows() -> None:
    """The first 8 scenarios of the smol-oracle benchmark: one batch of 8 computes 6256
    positions for 3666 tokens; at least 90% real tokens a batch, 3819."""
    lengths = [348, 234, 180, 275, 782, 730, 764, 353]
    assert padded_tokens(lengths, length_batches(lengths, 8, 32768)) == 6256
    batches = length_batches(lengths, 8, 32768, min_fill=0.9)
    assert [[lengths[i] for i in b] for b in batches] == [
        [782, 764, 730],
        [353, 348, 275],
        [234],
        [180],
    ]
    assert padded_tokens(lengths, batches) == 3819
    for batch in batches:
        assert sum(lengths[i] for i in batch) >= 0.9 * padded_tokens(lengths, [batch])
    # Equal lengths always share a batch; 0 keeps the row and token limits alone.
    assert length_batches([5, 5, 5], 8, 100, min_fill=1.0) == [[0, 1, 2]]
    assert length_batches(lengths, 8, 32768, min_fill=0.0) == length_batches(lengths, 8, 32768)
    with pytest.raises(ValueError, match="min_fill"):
        length_batches(lengths, 8, 32768, min_fill=1.5)


def test_sorting_computes_less_padding_than_the_input_order() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(100, 550) for _ in range(189)]
    sorted_batches = length_batches(lengths, 8, 32768)
    in_order = [list(range(i, min(i + 8, len(lengths)))) for i in range(0, len(lengths), 8)]
    assert len(sorted_batches) == len(in_order) == 24
    assert padded_tokens(lengths, sorted_batches) < 1.05 * sum(lengths)
    assert padded_tokens(lengths, in_order) > 1.3 * sum(lengths)


def test_empty_input_and_bad_limits() -> None:
    assert length_batches([], 4, 100) == []
    assert padded_tokens([], []) == 0
    with pytest.raises(ValueError, match="must be >= 1"):
        length_batches([3], 0, 100)
    with pytest.raises(ValueError, match="must be >= 1"):
        length_batches([3], 4, 0)


def test_even_batches_share_rows_equally_within_the_same_limits() -> None:
    lengths = [10 + i % 7 for i in range(139)]
    batches = even_batches(lengths, 128, 1_000_000)
    assert [len(b) for b in batches] == [70, 69]  # not 128 + 11
    assert sorted(i for b in batches for i in b) == list(range(139))
    # The token bound still applies, and rows stay longest first as in length_batches.
    assert even_batches(lengths, 128, 16 * 10) == length_batches(lengths, 70, 16 * 10)
    assert even_batches([5, 9], 128, 100) == [[1, 0]]
    assert even_batches([], 128, 100) == []
