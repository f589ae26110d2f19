"""The fast decode path gives the reference path's rollouts, turn for turn.

Real transformers + peft on the demo checkpoint: each model is loaded once per module, the
reference rollouts are computed once per case, and the fast path is compared with them one
scenario at a time (no batching) and batched (``prefetch`` of the whole subset, and batches
of 3 so that rows of different lengths share a padded forward pass).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Iterator, Sequence

import pytest

from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.records import Rollout
from pytest_memeval.decode import make_model_decoder
from pytest_memeval.decode.fast import FastDecoder, unsafe_generation_settings
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.model.prompts import conversation_ids

from ..conftest import ADAPTERS, BASE_MODEL, MemevalProject, demo_records

# Slow: every test loads the demo model and decodes with both paths.
pytestmark = pytest.mark.slow

MAX_NEW = 16
N_SCENARIOS = 8

# (adapter, data variant, dtype): both demo profiles, the base model alone, whose
# predictions are often wrong, so that the generate fallback must run, and the oracle profile
# in bfloat16, where near ties are common and the bounds are relative (ulps).
CASES = {
    "baseline": ("baseline", "baseline", "float32"),
    "oracle": ("oracle", "oracle", "float32"),
    "base-only": (None, "baseline", "float32"),
    "oracle-bf16": ("oracle", "oracle", "bfloat16"),
}


def scenarios(variant: str, n: int = N_SCENARIOS) -> list[Scenario]:
    return list(from_records(demo_records(variant, n), f"demo {variant}").scenarios)


def outputs(rollout: Rollout) -> list[tuple[str, bool]]:
    return [(o.text, o.stopped) for o in rollout.outputs]


def assert_same(fast: Sequence[Rollout], reference: Sequence[Rollout], ids: Sequence[str]) -> None:
    assert len(fast) == len(reference) == len(ids)
    for sid, f, r in zip(ids, fast, reference, strict=True):
        assert f.path == "fast" and r.path == "reference"
        assert outputs(f) == outputs(r), f"scenario {sid}: fast and reference rollouts differ"
        assert f.prompt_tail == r.prompt_tail
        assert not f.notes, f"scenario {sid} fell back: {f.notes}"


class Case:
    def __init__(self, name: str, loaded: LoadedModel, variant: str) -> None:
        self.name = name
        self.loaded = loaded
        self.scenarios = scenarios(variant)
        ref = ReferenceDecoder(loaded, MAX_NEW)
        self.reference = [ref.rollout(s) for s in self.scenarios]
        self.ids = [s.id for s in self.scenarios]


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request: pytest.FixtureRequest) -> Iterator[Case]:
    import torch

    torch.set_num_threads(1)  # shared 2-core machines
    adapter, variant, dtype = CASES[request.param]
    loaded = load_model(BASE_MODEL, ADAPTERS / adapter if adapter else None, dtype=dtype)
    yield Case(request.param, loaded, variant)


def test_one_scenario_at_a_time_matches_reference(case: Case) -> None:
    decoder = make_model_decoder("fast", case.loaded, MAX_NEW)
    assert isinstance(decoder, FastDecoder)
    fast = [decoder.rollout(s) for s in case.scenarios]
    assert_same(fast, case.reference, case.ids)
    turns = sum(len(r.outputs) for r in fast)
    stats = decoder.stats
    assert stats.turns == turns
    assert stats.teacher_forced + stats.forward_only + stats.generated == turns
    # ``generated`` says truthfully whether the output followed the truth (a teacher-forced
    # check) or the model left it (settled by the verification pass or by ``generate``).
    forward = stats.teacher_forced + stats.forward_only
    assert sum(not o.generated for r in fast for o in r.outputs) == forward
    # The first batch calibrated the bounds against the reference call.
    assert 0 < stats.calibration_turns <= decoder.calibration_turns
    assert decoder.bounds.disagreement("first").absolute
    assert decoder.bounds.disagreement("generate").absolute
    if case.name == "base-only":
        # The base model alone is often wrong: the generate fallback must have run (and, by
        # the comparison above, agreed with the reference wherever it did).
        assert decoder.stats.generated_mismatch > 0
        # ... settled by the verification pass or by ``generate`` (every such turn: one)
        generated = sum(o.generated for r in fast for o in r.outputs)
        assert generated == decoder.stats.generated > 0


@pytest.mark.parametrize("batch_size", [3, 16])
def test_batched_matches_reference(case: Case, batch_size: int) -> None:
    decoder = FastDecoder(case.loaded, MAX_NEW, batch_size=batch_size)
    decoder.prefetch(case.scenarios)
    assert decoder.stats.scenarios == len(case.scenarios)
    fast = [decoder.rollout(s) for s in case.scenarios]
    # Everything came from the prefetch: nothing was decoded again, nothing is kept.
    assert decoder.stats.scenarios == len(case.scenarios)
    assert not decoder.prefetched
    assert_same(fast, case.reference, case.ids)


def test_margin_guard_reruns_near_ties_with_the_reference_call(case: Case) -> None:
    """An infinite bound makes every decision a 'near tie': every turn is generated, every
    cached generation is re-decided by the reference call, and the outputs still agree."""
    decoder = FastDecoder(case.loaded, MAX_NEW, margin=math.inf)
    fast = decoder.decode(case.scenarios[:3])
    assert decoder.stats.calibration_turns == 0  # a given margin is not calibrated
    turns = sum(len(r.outputs) for r in fast)
    assert all(o.generated for r in fast for o in r.outputs)
    assert decoder.stats.generated_near_tie == turns
    assert decoder.stats.generated_reference_rerun == turns
    assert_same(fast, case.reference[:3], case.ids[:3])


def test_truth_as_a_draft_and_calibration_agree_with_reference(case: Case) -> None:
    """Wrong turns continue from the truth the model did reproduce (its draft), generated
    one scenario at a time and batched; a calibration may cover every turn. Both agree with
    the reference turn for turn."""
    decoder = FastDecoder(case.loaded, MAX_NEW, batch_size=3)
    assert_same(decoder.decode(case.scenarios), case.reference, case.ids)
    if decoder.stats.generated_mismatch:
        assert decoder.stats.draft_tokens > 0
    everything = FastDecoder(case.loaded, MAX_NEW, batch_size=16, calibration_turns=10_000)
    fast = everything.decode(case.scenarios)
    assert_same(fast, case.reference, case.ids)
    # The calibration measures the first forward pass's turns (every one with a truth): the
    # longest scenarios, as many as share a pass (FORWARD_MIN_FILL limits its padding).
    lengths = [len(conversation_ids(case.loaded.tokenizer, s)) for s in case.scenarios]
    first = everything.batch_groups(lengths)[0]
    with_truth = sum(
        1
        for i in first
        for k in case.scenarios[i].assistant_indices
        if case.scenarios[i].messages[k]["content"]
    )
    assert everything.stats.calibration_turns == with_truth > 0


def test_bounds_come_from_the_measured_disagreement(case: Case) -> None:
    """The decisions follow the measured disagreement. Under its own calibration a decoder
    trusts most first-token decisions; under the same calibration but for a first-token
    disagreement far above any margin, none: every turn with a truth is a near tie at its
    first token and goes to ``generate``. Both agree with the reference."""
    from pytest_memeval.decode.fast import PRIOR_ULPS, SAFETY, Disagreement, ulp

    subset, reference, ids = case.scenarios[:3], case.reference[:3], case.ids[:3]
    own = FastDecoder(case.loaded, MAX_NEW)
    assert_same(own.decode(subset), reference, ids)
    assert own.measured is not None and own.measured.turns > 0
    with_truth = own.stats.turns - own.stats.generated_no_truth
    assert own.stats.generated_near_tie < with_truth / 2
    if case.loaded.dtype == "bfloat16":
        # Relative bounds: at least SAFETY x 2 x the prior, in ulps of the top logit.
        assert own.bounds.ulps["step"] >= SAFETY * 2 * PRIOR_ULPS["bfloat16"]["step"]
        assert ulp(16.5, "bfloat16") == 0.125 and ulp(-9.0, "bfloat16") == 0.0625
    else:
        assert own.bounds.ulps["step"] == 0.0 and own.bounds.absolute["step"] >= 1e-3

    far = dataclasses.replace(
        own.measured, measured={**own.measured.measured, "first": Disagreement((1e6,), (1e12,))}
    )
    wide = FastDecoder(case.loaded, MAX_NEW)
    wide.use_calibration(far)
    assert_same(wide.decode(subset), reference, ids)
    assert wide.stats.calibration_turns == 0  # the given calibration, not a new one
    assert wide.stats.teacher_forced == 0
    assert wide.stats.generated_near_tie == with_truth
    # The other kinds' bounds are the decoder's own.
    assert wide.bounds.absolute["step"] == own.bounds.absolute["step"]
    assert wide.bounds.ulps["step"] == own.bounds.ulps["step"]


def test_truth_longer_than_max_new_tokens(case: Case) -> None:
    """With a 2-token budget the truth does not fit: greedy runs into the limit (stopped
    False), and the fast path must say exactly that too."""
    subset = case.scenarios[:3]
    ref = ReferenceDecoder(case.loaded, 2)
    reference = [ref.rollout(s) for s in subset]
    assert any(not o.stopped for r in reference for o in r.outputs)
    assert_same(FastDecoder(case.loaded, 2).decode(subset), reference, case.ids[:3])


@pytest.fixture(scope="module")
def oracle_model() -> LoadedModel:
    return load_model(BASE_MODEL, ADAPTERS / "oracle")


def test_prefix_property_failure_falls_back_to_reference(oracle_model: LoadedModel) -> None:
    """A template that renders the system message only in generation prompts: no turn prompt
    is a prefix of the conversation, so the scenario is decoded by the reference path and the
    rollout says why."""
    tokenizer = copy.deepcopy(oracle_model.tokenizer)
    tokenizer.chat_template = (
        "{% for message in messages %}"
        "{% if message['role'] != 'system' or add_generation_prompt %}"
        "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|eot|> ' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    loaded = dataclasses.replace(oracle_model, tokenizer=tokenizer)
    subset = scenarios("oracle", 2)
    fast = FastDecoder(loaded, MAX_NEW).decode(subset)
    ref = ReferenceDecoder(loaded, MAX_NEW)
    for scenario, rollout in zip(subset, fast, strict=True):
        assert rollout.notes and "not a token prefix" in rollout.notes[0]
        assert outputs(rollout) == outputs(ref.rollout(scenario))
        assert all(o.generated for o in rollout.outputs)


def test_unsafe_generation_settings_turn_the_fast_path_off(oracle_model: LoadedModel) -> None:
    from transformers import GenerationConfig

    assert unsafe_generation_settings(GenerationConfig()) == []
    assert unsafe_generation_settings(GenerationConfig(repetition_penalty=1.0)) == []
    assert unsafe_generation_settings(GenerationConfig(repetition_penalty=1.3)) == [
        "repetition_penalty=1.3"
    ]
    model = oracle_model.model
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.no_repeat_ngram_size = 2
    try:
        subset = scenarios("oracle", 2)
        fast = FastDecoder(oracle_model, MAX_NEW).decode(subset)
        ref = ReferenceDecoder(oracle_model, MAX_NEW)
        for scenario, rollout in zip(subset, fast, strict=True):
            assert rollout.notes and "no_repeat_ngram_size=2" in rollout.notes[0]
            assert outputs(rollout) == outputs(ref.rollout(scenario))
    finally:
        model.generation_config = saved


def test_plugin_runs_predict_what_the_reference_path_predicts(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch, oracle_model: LoadedModel
) -> None:
    """End to end, through the worker's prefetch (serial: the session's item order; xdist:
    each worker's queue): the default (fast) runs predict, turn for turn, what the reference
    decoder predicts on the same scenarios, and their summaries show throughput."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # shared 2-core machines: no oversubscription
    memeval_project.write(variant="oracle", n=5)
    ref = ReferenceDecoder(oracle_model, MAX_NEW)
    expected = [outputs(ref.rollout(s)) for s in scenarios("oracle", 5)]
    for label, extra in {"serial": [], "xdist": ["-n", "2"]}.items():
        out = memeval_project.path / "runs" / label
        result = memeval_project.run("--ckpt", "demo", "--memeval-out", str(out), *extra)
        result.stdout.fnmatch_lines(
            ["throughput: * scenarios/s over * s (decode fast, mean batch *)"]
        )
        text = (out / "predictions.jsonl").read_text("utf-8")
        records = [json.loads(line) for line in text.splitlines()]
        assert {r["decode"] for r in records} == {"fast"}
        got = [
            [(t["pred"], t["stopped"]) for t in r["turns"]]
            + [(r["final_pred"], r["final_stopped"])]
            for r in records
        ]
        diffs = [
            (r["id"], t, g, e)
            for r, gs, es in zip(records, got, expected, strict=True)
            for t, (g, e) in enumerate(zip(gs, es, strict=True))
            if g != e
        ]
        assert len(got) == len(expected) and not diffs, f"{label} run differs: {diffs[:5]}"


def test_prefetch_ignores_duplicates_and_known_scenarios(oracle_model: LoadedModel) -> None:
    subset = scenarios("oracle", 3)
    decoder = FastDecoder(oracle_model, MAX_NEW)
    decoder.prefetch([subset[0], subset[0], subset[1]])
    decoder.prefetch(subset[:2])
    assert decoder.stats.scenarios == 2
    first = decoder.rollout(subset[0])
    assert decoder.rollout(subset[2]).path == "fast"  # not prefetched: decoded on demand
    assert decoder.stats.scenarios == 3
    assert outputs(decoder.rollout(subset[0])) == outputs(first)  # decoded again, same result
    assert decoder.prefetched == {subset[1].id}


def test_rejects_bad_batch_settings(oracle_model: LoadedModel) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        FastDecoder(oracle_model, MAX_NEW, batch_size=0)
