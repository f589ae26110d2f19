"""The verification pass: generated turns settled by one cached forward pass over a guessed
continuation give exactly the reference path's predictions (real models: the demo and family
checkpoints, float32 and bfloat16), and the comparison catches a pass that accepts a token
the model did not choose."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode.fast import Checks, DecodeStats, FastDecoder
from pytest_memeval.decode.fast import verify as verify_stage
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.tools.cli import main

from ..conftest import ADAPTERS, BASE_MODEL, REPO, demo_records
from ..families import CHECKPOINTS, FAMILIES, family_records

MAX_NEW = 16
Outputs = list[list[tuple[str, bool | None]]]

# Slow: every test decodes the demo model on both paths, several dtypes.
pytestmark = pytest.mark.slow


def _outputs(rollouts: Sequence[Rollout]) -> Outputs:
    return [[(o.text, o.stopped) for o in r.outputs] for r in rollouts]


def _reference(loaded: LoadedModel, scenarios: Sequence[Scenario], max_new: int) -> Outputs:
    reference = ReferenceDecoder(loaded, max_new)
    return _outputs([reference.rollout(s) for s in scenarios])


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def demo_base(request: pytest.FixtureRequest) -> Iterator[LoadedModel]:
    """The demo model with its ``oracle`` adapter (what ``memeval bench`` decodes): it leaves
    the truth on many turns, often with another answer of the benchmark, sometimes not (so
    guesses are right and wrong)."""
    import torch

    torch.set_num_threads(1)
    yield load_model(BASE_MODEL, ADAPTERS / "oracle", dtype=request.param)


def _demo(n: int) -> list[Scenario]:
    return list(from_records(demo_records("oracle", n), "demo").scenarios)


def _assert_all_cases(stats: DecodeStats) -> None:
    """The turns took every road of the pass: settled with the guess accepted to its end,
    guess left by the model (draft grown), and a grown draft fed again from where the
    forward pass's cache ends (packed passes; ``generate`` continuing from a grown draft is
    test_fast_verify_packed's)."""
    assert stats.verify_passes > 0
    assert stats.verified_guess > 0, stats
    assert stats.verify_left_guess > 0, stats
    assert stats.verify_refed > 0, stats
    assert stats.verified + stats.generate_turns == stats.generated


def test_demo_verified_turns_equal_the_reference(demo_base: LoadedModel) -> None:
    scenarios = _demo(6)
    fast = FastDecoder(demo_base, MAX_NEW)
    assert _outputs(fast.decode(scenarios)) == _reference(demo_base, scenarios, MAX_NEW)
    _assert_all_cases(fast.stats)
    # The new kind was measured like the others and set its own bound.
    assert fast.bounds.disagreement("verify").absolute, "the calibration did not measure the pass"
    assert fast.stats.verified > fast.stats.generate_turns / 4


def test_demo_small_budget_stops_where_generate_stops(demo_base: LoadedModel) -> None:
    """max_new_tokens cuts answers mid-way: the pass settles turns at the budget
    (``stopped`` False), exactly where ``generate`` runs out."""
    scenarios = _demo(3)
    fast = FastDecoder(demo_base, 3, batch_size=1)
    out = fast.decode(scenarios)
    assert _outputs(out) == _reference(demo_base, scenarios, 3)
    assert fast.stats.verified > 0
    assert any(o.stopped is False for r in out for o in r.outputs)
    # ... and the pass itself ended turns at the budget (not ``generate`` after it)
    assert fast.stats.verified_at_budget > 0, fast.stats


def test_rows_of_different_passes_and_lengths_share_a_verification_pass(
    demo_base: LoadedModel,
) -> None:
    """One scenario per forward pass: rows of different caches, prompts of different
    lengths (left padding of the cut caches, right padding of the guesses) in one pass."""
    scenarios = _demo(4)
    fast = FastDecoder(demo_base, MAX_NEW, batch_size=1)
    assert _outputs(fast.decode(scenarios)) == _reference(demo_base, scenarios, MAX_NEW)
    assert 0 < fast.stats.verify_passes < fast.stats.verified


def test_the_comparison_catches_a_pass_that_accepts_one_token_too_many(
    demo_base: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deliberately broken pass: where the model leaves the guess, it takes the guessed
    token instead (one token too many accepted)."""
    accept = verify_stage.accept

    def accepts_the_guess(
        drafted: int, guess: Sequence[int], checks: Checks, **rules: Any
    ) -> verify_stage.Acceptance:
        forced = list(checks.best)
        for k, want in enumerate(guess):
            if forced[k] != want:
                forced[k] = want
                break
        return accept(drafted, guess, Checks(forced, checks.margin, checks.top), **rules)

    monkeypatch.setattr(verify_stage, "accept", accepts_the_guess)
    scenarios = _demo(6)
    broken = FastDecoder(demo_base, MAX_NEW)
    assert _outputs(broken.decode(scenarios)) != _reference(demo_base, scenarios, MAX_NEW)


# --------------------------------------------------------------------------- families
def _family(name: str, n: int) -> list[Scenario]:
    records = family_records(FAMILIES[name], "baseline", "val", n)
    return list(from_records(records, "family test").scenarios)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama3", "qwen2.5", "phi"])
def test_family_verified_turns_equal_the_reference(name: str, dtype: str) -> None:
    loaded = load_model(CHECKPOINTS / name, None, dtype=dtype)
    scenarios = _family(name, 3)
    # The verification pass itself: where the CPU's bf16 kernels are batch-invariant (the
    # probe decides, by machine) exact mode would settle these turns instead.
    fast = FastDecoder(loaded, MAX_NEW, exact=False)
    assert _outputs(fast.decode(scenarios)) == _reference(loaded, scenarios, MAX_NEW)
    assert fast.stats.verify_passes > 0
    assert fast.stats.verified > 0, fast.stats


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_sliding_window_families_cannot_verify_and_stay_exact(name: str) -> None:
    """A sliding-window or hybrid cache cannot be cut: no verification pass, every wrong
    turn generated from the full prompt, predictions unchanged."""
    loaded = load_model(CHECKPOINTS / name, None)
    scenarios = _family(name, 2)
    fast = FastDecoder(loaded, MAX_NEW)
    assert _outputs(fast.decode(scenarios)) == _reference(loaded, scenarios, MAX_NEW)
    assert fast.stats.generated > 0
    assert fast.stats.verify_passes == 0
    assert fast.stats.verified == 0
    assert fast.stats.generated_without_cache == fast.stats.generated


@pytest.mark.slow
def test_bench_reports_the_verification_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "--profiles",
            str(REPO / "pyproject.toml"),
            "-n",
            "4",
            "--turns",
            "",
            "--threads",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert re.search(
        r"; [1-9]\d* generated turns settled by the verification pass \(\d+ passes, \d+ tokens "
        r"accepted\), \d+ left to generate \(\d+ from a draft the pass made longer\)",
        out,
    ), out
    assert re.search(
        r"verification pass \(cached multi-token forward\) vs the reference call: max [\d.e-]+, "
        r"p99 [\d.e-]+ over [1-9]\d* positions; bound",
        out,
    ), out
    assert re.search(r"[\d.]+ forward passes, [\d.]+ verification passes, [\d.]+ generate", out)
    assert out.strip().endswith("predictions identical: yes") and code == 0
