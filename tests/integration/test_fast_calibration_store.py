"""The calibration kept in the cache directory (decode/fast/stored.py): measured once per
model and setting, reused with the same predictions, measured again when anything it
depends on changes or its entry is damaged (real demo model, real reference calls)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import (
    KINDS,
    CalibrationCacheWarning,
    CalibrationStore,
    FastDecoder,
    StoredCalibration,
)
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model

from ..conftest import ADAPTERS, BASE_MODEL, demo_records

# Demo-model decodes measuring and reusing calibrations: not the inner loop.
pytestmark = pytest.mark.slow

MAX_NEW = 16
WEIGHTS = {"model": "sha256:demo-base", "adapter": "sha256:demo-oracle"}


@pytest.fixture(scope="module")
def oracle() -> Iterator[LoadedModel]:
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle")


@pytest.fixture(scope="module")
def scenarios() -> list[Scenario]:
    return list(from_records(demo_records("oracle", 3), "demo").scenarios)


def _outputs(rollouts: Sequence[Rollout]) -> list[list[tuple[str, bool | None]]]:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


def _decode(
    loaded: LoadedModel, scenarios: list[Scenario], store: CalibrationStore, **settings: int
) -> tuple[FastDecoder, list[Rollout]]:
    decoder = FastDecoder(loaded, MAX_NEW, store=store, **settings)
    return decoder, decoder.decode(scenarios)


def _entries(root: Path) -> list[Path]:
    return sorted((root / "calibration").glob("*.json"))


def test_a_second_decoder_reuses_the_stored_calibration_and_predicts_the_same(
    oracle: LoadedModel, scenarios: list[Scenario], tmp_path: Path
) -> None:
    store = CalibrationStore(tmp_path, WEIGHTS, run="run-1")
    first, first_rollouts = _decode(oracle, scenarios, store)
    outcome = first.calibration_outcome
    assert outcome is not None and outcome.source == "measured" and outcome.seconds > 0
    assert first.stats.calibration_turns > 0
    assert _entries(tmp_path) == [outcome.entry]
    stored = StoredCalibration.from_dict(json.loads(outcome.entry.read_text("utf-8")))
    assert stored.run == "run-1" and stored.calibration == first.measured
    assert stored.key["fingerprints"] == WEIGHTS
    assert stored.key["setting"] == first.measurement_setting()

    second, second_rollouts = _decode(oracle, scenarios, CalibrationStore(tmp_path, WEIGHTS, "r2"))
    again = second.calibration_outcome
    assert again is not None and again.source == "reused" and again.seconds == 0.0
    assert again.entry == outcome.entry
    # Nothing measured: no turn run by the reference call to calibrate, no time spent.
    assert second.stats.calibration_turns == 0 and second.seconds.calibration == 0.0
    assert second.measured is None and second.calibration == first.measured
    for kind in KINDS:
        assert second.bounds.absolute[kind] == first.bounds.absolute[kind]
    reference = ReferenceDecoder(oracle, MAX_NEW)
    expected = _outputs([reference.rollout(s) for s in scenarios])
    assert _outputs(second_rollouts) == _outputs(first_rollouts) == expected
    # A decoder that reused one can hand it on, as one that measured it can.
    assert FastDecoder(oracle, MAX_NEW).adopt_calibration(second)


def test_anything_the_calibration_depends_on_is_part_of_its_key(
    oracle: LoadedModel, scenarios: list[Scenario], tmp_path: Path
) -> None:
    store = CalibrationStore(tmp_path, WEIGHTS)
    base = FastDecoder(oracle, MAX_NEW).measurement_setting()
    for name in ("dtype", "device", "device_name", "threads", "attention", "torch", "peft"):
        assert base[name] is not None, name
    variants = [
        store.entry(base),
        CalibrationStore(tmp_path, {**WEIGHTS, "adapter": "sha256:other"}).entry(base),
        CalibrationStore(tmp_path, {"model": WEIGHTS["model"], "adapter": None}).entry(base),
        store.entry(FastDecoder(oracle, MAX_NEW, batch_size=2).measurement_setting()),
        store.entry(FastDecoder(oracle, 8).measurement_setting()),
        store.entry(FastDecoder(oracle, MAX_NEW, forward_attention=None).measurement_setting()),
        store.entry(FastDecoder(oracle, MAX_NEW, calibration_turns=4).measurement_setting()),
        store.entry({**base, "dtype": "bfloat16"}),
        store.entry({**base, "device_name": "another CPU"}),
        store.entry({**base, "threads": 7}),
        store.entry({**base, "transformers": "0.0"}),
    ]
    assert len(set(variants)) == len(variants)
    # ... and a changed key measures again, into its own entry.
    _decode(oracle, scenarios, store)
    changed, _ = _decode(oracle, scenarios, store, batch_size=2)
    assert changed.calibration_outcome is not None
    assert changed.calibration_outcome.source == "measured"
    assert len(_entries(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["truncated", "not json", "another key", "empty"])
def test_a_damaged_entry_is_measured_again_with_a_warning(
    oracle: LoadedModel, scenarios: list[Scenario], tmp_path: Path, damage: str
) -> None:
    store = CalibrationStore(tmp_path, WEIGHTS)
    first, rollouts = _decode(oracle, scenarios, store)
    assert first.calibration_outcome is not None and first.calibration_outcome.entry
    entry = first.calibration_outcome.entry
    good = entry.read_text("utf-8")
    if damage == "truncated":
        entry.write_text(good[: len(good) // 2], "utf-8")
    elif damage == "not json":
        entry.write_bytes(b"\xff\xfe garbage")
    elif damage == "empty":
        entry.write_text("", "utf-8")
    else:  # a whole document of another key (e.g. copied by hand)
        other = json.loads(good)
        other["key"]["fingerprints"]["model"] = "sha256:another"
        entry.write_text(json.dumps(other), "utf-8")
    with pytest.warns(CalibrationCacheWarning, match="could not be used.*measured again"):
        again, again_rollouts = _decode(oracle, scenarios, store)
    assert again.calibration_outcome is not None
    assert again.calibration_outcome.source == "measured" and again.stats.calibration_turns > 0
    assert _outputs(again_rollouts) == _outputs(rollouts)
    # Replaced by a whole, readable entry of the right key, which the next decoder reuses.
    StoredCalibration.from_dict(json.loads(entry.read_text("utf-8")))
    third, _ = _decode(oracle, scenarios, store)
    assert third.calibration_outcome is not None
    assert third.calibration_outcome.source == "reused"


def test_a_cache_that_cannot_be_written_costs_the_reuse_not_the_run(
    oracle: LoadedModel, scenarios: list[Scenario], tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory", "utf-8")
    with pytest.warns(CalibrationCacheWarning, match="cannot be stored"):
        decoder, rollouts = _decode(oracle, scenarios, CalibrationStore(blocked, WEIGHTS))
    outcome = decoder.calibration_outcome
    assert outcome is not None and outcome.source == "measured" and outcome.entry is None
    assert decoder.measured is not None and decoder.stats.calibration_turns > 0
    assert len(rollouts) == len(scenarios)


def test_recalibrating_measures_once_per_run_and_replaces_the_entry(
    oracle: LoadedModel, scenarios: list[Scenario], tmp_path: Path
) -> None:
    _decode(oracle, scenarios, CalibrationStore(tmp_path, WEIGHTS, run="old"))
    fresh = CalibrationStore(tmp_path, WEIGHTS, run="new", fresh=True)
    first, _ = _decode(oracle, scenarios, fresh)
    second, _ = _decode(oracle, scenarios, fresh)  # another worker of the same run
    assert first.calibration_outcome is not None and second.calibration_outcome is not None
    assert first.calibration_outcome.source == "measured"
    assert second.calibration_outcome.source == "reused"
    (entry,) = _entries(tmp_path)
    assert json.loads(entry.read_text("utf-8"))["run"] == "new"
