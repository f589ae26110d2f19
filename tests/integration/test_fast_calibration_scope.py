"""A calibration is adopted only under the settings it was measured with, and a ``generate``
call's kept logits are bounded by rows (real demo model)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.decode.fast import GENERATE_LOGITS_BYTES, GENERATE_ROWS, FastDecoder
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records


@pytest.fixture(scope="module")
def oracle() -> Iterator[LoadedModel]:
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


def _calibrated(loaded: LoadedModel, **settings: int) -> FastDecoder:
    decoder = FastDecoder(loaded, 16, **settings)
    decoder.decode(list(from_records(demo_records("oracle", 3), "x").scenarios))
    assert decoder.stats.calibration_turns > 0 and decoder.measured is not None
    return decoder


def test_a_calibration_of_other_settings_is_refused_naming_them(oracle: LoadedModel) -> None:
    first = _calibrated(oracle, batch_size=4)
    assert FastDecoder(oracle, 16, batch_size=4).adopt_calibration(first)
    with pytest.raises(ValueError, match=r"these differ: batch_size$"):
        FastDecoder(oracle, 16, batch_size=2).adopt_calibration(first)
    with pytest.raises(ValueError, match=r"these differ: batch_size, max_new_tokens$"):
        FastDecoder(oracle, 8, batch_size=2).adopt_calibration(first)
    with pytest.raises(ValueError, match="forward_attention"):
        FastDecoder(oracle, 16, batch_size=4, forward_attention=None).adopt_calibration(first)


def test_generate_rows_are_capped_by_the_logits_they_keep(oracle: LoadedModel) -> None:
    vocab = oracle.model.get_output_embeddings().weight.shape[0]
    assert FastDecoder(oracle, 16).generator.rows_per_call == GENERATE_ROWS  # 54 tokens: no cap
    budget = 100_000
    capped = FastDecoder(oracle, budget).generator.rows_per_call
    assert capped == GENERATE_LOGITS_BYTES // (budget * vocab * 8)
    assert 1 <= capped < GENERATE_ROWS
