"""Model families as users run them: Llama-3, Qwen2.5, Mistral, Gemma, Phi, GPT-2 shapes.

Each family is a tiny committed checkpoint (``tests/family_checkpoints/``, rebuilt by
``python -m tests.families``: the real transformers architecture, a byte-level BPE tokenizer,
a chat template modelled on the family's published one); adapters are built per session.
Every case is checked against a plain per-turn ``generate`` loop
(``tests/plainloop.py``), independent of the plugin: the chat template applied by
``apply_chat_template``, ``model.generate`` with the checkpoint's own generation config, the
new tokens decoded without special tokens.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.compat.attention import can_switch_attention, switched_attention
from pytest_memeval.compat.transformers import lm_forward
from pytest_memeval.core.benchmark import Scenario, from_records
from pytest_memeval.core.history import fed_back
from pytest_memeval.decode import make_model_decoder
from pytest_memeval.decode.fast import (
    CacheSlice,
    ExactStage,
    FastDecoder,
    GenerateRow,
    Generator,
    Shared,
    probe_linear_rows,
)
from pytest_memeval.decode.reference import ReferenceDecoder, reference_steps
from pytest_memeval.model.checks import check_adapter_fits, fingerprint_dir
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.model.preflight import context_limit, preflight
from pytest_memeval.model.prompts import scenario_prompts

from ..conftest import BASE_MODEL, INNER_ADDOPTS, MemevalProject, run_forked, write_jsonl
from ..families import (
    CHECKPOINTS,
    FAMILIES,
    LLAMA3_TEMPLATE,
    QWEN_THINKING_TEMPLATE,
    build_adapter,
    copy_family,
    edit_json,
    family_records,
)
from ..plainloop import plain_free_running, plain_loop, record_outputs, rollout_outputs

# Slow: every test loads or trains tiny checkpoints of other model families.
pytestmark = pytest.mark.slow

MAX_NEW = 16


class Built:
    """The committed family checkpoints, and their adapters (built on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._adapters: dict[str, Path] = {}

    def model(self, name: str) -> Path:
        path = CHECKPOINTS / name
        assert (path / "model.safetensors").is_file(), "rebuild with python -m tests.families"
        return path

    def adapter(self, name: str) -> Path:
        """The family's LoRA adapter (its ``lora_targets`` and ``modules_to_save``)."""
        if name not in self._adapters:
            family = FAMILIES[name]
            self._adapters[name] = build_adapter(
                self.model(name),
                self.root / "adapters" / name,
                family.lora_targets,
                family.modules_to_save,
                fan_in_fan_out=name == "gpt2",
            )
        return self._adapters[name]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The fixtures; and every module they need imported now, before any test's pytester
    takes its sys.modules snapshot (modules first imported inside such a test are dropped at
    its end, and torch and numpy cannot be imported twice in one process)."""
    import peft  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    for name in FAMILIES:
        AutoTokenizer.from_pretrained(str(CHECKPOINTS / name))
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(CHECKPOINTS / name)))
    return Built(tmp_path_factory.mktemp("families"))


def scenarios_of(records: Sequence[dict[str, Any]]) -> list[Scenario]:
    return list(from_records(records, "family test").scenarios)


def val_records(name: str, n: int) -> list[dict[str, Any]]:
    return family_records(FAMILIES[name], "baseline", "val", n)


# --------------------------------------------------------------------------- the plain loop
def load_plain(model_dir: Path, adapter: Path | None = None, dtype: str = "float32") -> Any:
    """The model as a user loads it by hand (no pytest-memeval code)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager"
    )
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval(), tok


# --------------------------------------------------------------------------- decoders, dtypes
@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, built: Built) -> Iterator[str]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    built.model(request.param)
    yield request.param
    torch.set_num_threads(threads)


def test_fp32_fast_and_reference_equal_the_plain_loop(family: str, built: Built) -> None:
    """fp32: the plain loop, the reference decoder and the fast decoder agree turn by turn;
    where the family stops on an eos id the tokenizer does not call eos, the loop (and so
    the plugin) stopped on it."""
    model_dir = built.model(family)
    scenarios = scenarios_of(val_records(family, 3))
    model, tok = load_plain(model_dir)
    expected = [plain_loop(model, tok, s.messages, MAX_NEW) for s in scenarios]
    loaded = load_model(model_dir, None)
    reference = [rollout_outputs(ReferenceDecoder(loaded, MAX_NEW).rollout(s)) for s in scenarios]
    fast_decoder = FastDecoder(loaded, MAX_NEW)
    fast = [rollout_outputs(r) for r in fast_decoder.decode(scenarios)]
    assert reference == expected
    assert fast == expected
    stopped = sum(stop for turns in expected for _, stop in turns)
    assert stopped > 0, "the fixture never stops: it proves nothing about stop ids"
    spec = FAMILIES[family]
    extra_stops = set(spec.stop) - {spec.eos}
    if extra_stops:
        # The loaded stop ids are the generation config's list, not the tokenizer's eos...
        assert len(loaded.stop_ids) == len(spec.stop)
        assert loaded.tokenizer.eos_token_id in loaded.stop_ids
        # ... and the fixture's turns do end on an id that only the list names.
        turn_end = tok.convert_tokens_to_ids(sorted(extra_stops)[-1])
        assert any(turn_end in p.ids for p in scenario_prompts(tok, scenarios[0])[0])
    if spec.config.get("sliding_window"):
        # Conversations longer than the window: the sliding-window cache cannot be cut
        # into prefixes, so generated turns take the documented no-cache route.
        assert (
            max(len(scenario_prompts(tok, s)[1]) for s in scenarios) > spec.config["sliding_window"]
        )
        # Some turn must be generated, or the no-cache check below would pass vacuously.
        assert fast_decoder.stats.generated > 0
        assert fast_decoder.stats.generated_without_cache == fast_decoder.stats.generated
    else:
        assert fast_decoder.stats.generated_without_cache == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_fast_equals_reference(family: str, built: Built, dtype: str) -> None:
    """bfloat16 and float16: the fast path's predictions equal the reference path's (the
    margin guard sends the many 16-bit near ties to real generation)."""
    scenarios = scenarios_of(val_records(family, 2))
    loaded = load_model(built.model(family), None, dtype=dtype)
    assert loaded.model.dtype == getattr(__import__("torch"), dtype)
    reference = [rollout_outputs(ReferenceDecoder(loaded, MAX_NEW).rollout(s)) for s in scenarios]
    decoder = FastDecoder(loaded, MAX_NEW)
    assert [rollout_outputs(r) for r in decoder.decode(scenarios)] == reference
    assert decoder.stats.turns == sum(len(r) for r in reference)


# --------------------------------------------------------------------------- free-running
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_free_running_fast_equals_reference_and_the_plain_loop(
    family: str, built: Built, dtype: str
) -> None:
    """Free-running (``history="model"``): the fast path's rollouts equal the reference
    path's; up to the first turn that leaves the truth they are the teacher-forced outputs;
    in fp32 the reference is the user's own loop (above)."""
    scenarios = scenarios_of(val_records(family, 2))
    loaded = load_model(built.model(family), None, dtype=dtype)
    free = [ReferenceDecoder(loaded, MAX_NEW, history="model").rollout(s) for s in scenarios]
    fast = make_model_decoder("fast", loaded, MAX_NEW, "model")
    fast.prefetch(scenarios)
    assert [rollout_outputs(fast.rollout(s)) for s in scenarios] == [
        rollout_outputs(r) for r in free
    ]
    forced = ReferenceDecoder(loaded, MAX_NEW)
    for scenario, rollout in zip(scenarios, free, strict=True):
        targets = [scenario.messages[k]["content"] for k in scenario.assistant_indices]
        for i, (mine, theirs) in enumerate(
            zip(rollout.outputs, forced.rollout(scenario).outputs, strict=True)
        ):
            assert mine.text == fed_back(theirs.text), (scenario.id, i)
            if mine.text != targets[i]:
                break  # the prompts differ from here on
    if dtype == "float32":
        model, tok = load_plain(built.model(family))
        expected = [plain_free_running(model, tok, s.messages, MAX_NEW) for s in scenarios]
        assert [rollout_outputs(r) for r in free] == expected


#: families whose cache has sliding-window layers: the exact stage cannot read their prefill's
#: cache (the calibration's check turns exact mode off for them)
SLIDING_CACHES = {"mistral", "gemma"}


def test_exact_stage_gives_the_reference_calls_logits_bit_for_bit(
    family: str, built: Built
) -> None:
    """bf16: the exact stage (the reference's own prefill, then batched single-token steps
    with per-row attention through each architecture's own attention function) gives the
    reference call's logits bit for bit, or, where the cache is sliding-window, hands the
    turns to the reference call. The tiny
    models' weights are rarely batch-invariant here: allowed to run row by row."""
    import torch

    loaded = load_model(built.model(family), None, dtype="bfloat16")
    probe = probe_linear_rows(loaded.model, share=1.0)
    if not probe.on:
        pytest.skip(f"batch-variant kernels for every row count here: {probe.reason}")
    stage = ExactStage(Shared.new(loaded, MAX_NEW, FastDecoder(loaded, MAX_NEW).bounds))
    assert stage.unavailable is None
    prompts = [
        p.ids
        for s in scenarios_of(val_records(family, 2))
        for p in scenario_prompts(loaded.tokenizer, s)[0]
    ]
    turns = stage.decode(prompts, probe, keep_logits=True)
    references = [reference_steps(loaded, p, MAX_NEW) for p in prompts]
    assert [list(t.tokens) for t in turns] == [r.tokens for r in references]
    if family in SLIDING_CACHES:
        # each turn handed to the reference call (the calibration's check turns the mode
        # off on such a turn: no logits of its own to compare)
        assert stage.stats.exact_reference == len(prompts) and not any(t.logits for t in turns)
        return
    assert stage.stats.exact_reference == 0
    for turn, reference in zip(turns, references, strict=True):
        assert len(turn.logits) == len(reference.logits)
        assert all(torch.equal(a, b) for a, b in zip(turn.logits, reference.logits, strict=True))


@pytest.mark.parametrize("attention", ["model", "sdpa"])
def test_cached_generate_grows_its_cache_in_place_with_the_concatenated_bits(
    family: str, built: Built, attention: str
) -> None:
    """The batched cached ``generate`` (the closed loop's and the teacher-forced path's)
    writes each step's keys and values into room left in its cache instead of concatenating
    (``compat.transformers.growing_cache``): the same tokens and the same logits, bit for
    bit, as the concatenating cache, on every family, with the adapter, rows of different
    lengths (left padding), under the model's attention and under sdpa (the closed loop's
    switch). A sliding-window cache cannot be cut: no call, in place or not."""
    import torch

    loaded = load_model(built.model(family), built.adapter(family))
    if attention == "sdpa" and not can_switch_attention(loaded.model, "sdpa"):
        pytest.skip(f"{family}: no sdpa to switch to (the closed loop keeps the model's)")
    prompts = [
        p.ids
        for s in scenarios_of(val_records(family, 2))
        for p in scenario_prompts(loaded.tokenizer, s)[0]
    ][:5]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    rows = []
    with torch.inference_mode():
        for ids in prompts:
            cache = lm_forward(loaded.model, {"input_ids": torch.tensor([ids[:-1]])}).cache
            assert cache is not None
            rows.append(GenerateRow(CacheSlice(cache, 0, 0, len(ids) - 1), tuple(ids), 0))
    shared = Shared.new(loaded, MAX_NEW, FastDecoder(loaded, MAX_NEW).bounds)
    calls = []
    with switched_attention(loaded.model, None if attention == "model" else attention):
        for in_place in (True, False):
            generator = Generator(shared, max_batch_tokens=1 << 20, grow_in_place=in_place)
            calls.append(generator.run(rows))
    grown, concatenated = calls
    if family in SLIDING_CACHES:
        assert grown is None and concatenated is None
        return
    assert grown is not None and concatenated is not None
    assert grown.tokens == concatenated.tokens
    assert torch.equal(grown.logits, concatenated.logits)


# --------------------------------------------------------------------------- BOS
@pytest.mark.parametrize("name", ["llama3", "mistral", "gemma"])
def test_exactly_one_bos_when_template_and_tokenizer_both_add_it(name: str, built: Built) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built.model(name)))
    bos = tok.bos_token_id
    assert tok("x")["input_ids"][0] == bos, "the fixture's tokenizer must add BOS on encode"
    assert "bos_token" in tok.chat_template, "the fixture's template must write BOS itself"
    prompts, full = scenario_prompts(tok, scenarios_of(val_records(name, 1))[0])
    for ids in [full, *(p.ids for p in prompts)]:
        assert ids[0] == bos and ids.count(bos) == 1


def test_token_guard_flags_a_doubled_bos_in_a_users_profile(
    pytester: pytest.Pytester, built: Built
) -> None:
    """A user's template that writes BOS on top of one the base template writes: the token
    guard on the user's own profile fails, naming the scenario and the doubled token."""
    model = copy_family(
        built.model("llama3"),
        Path(pytester.path) / "my-llama",
        template="{{ bos_token }}" + LLAMA3_TEMPLATE,
    )
    write_jsonl(Path(pytester.path) / "val.jsonl", val_records("llama3", 2))
    pytester.makefile(
        ".toml",
        pyproject=textwrap.dedent(
            f"""
            [tool.pytest.ini_options]
            addopts = "{INNER_ADDOPTS}"

            [tool.memeval.ckpt.mine]
            model = "{model.as_posix()}"
            benchmark = "val.jsonl"

            [tool.memeval.guards.mine]
            """
        ),
    )
    pytester.makepyfile(
        test_guards="from pytest_memeval.guard_tests import test_prompt_prefix  # noqa: F401\n"
    )
    result = run_forked(pytester, "test_guards.py")
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert (
        "mine scenario 's0001': the prompt of turn 0 (messages[2]) starts with a doubled BOS "
        "token (0 '<|begin_of_text|>' twice)"
    ) in text


# --------------------------------------------------------------------------- templates
def write_project(
    project: MemevalProject,
    model: Path,
    records: Sequence[dict[str, Any]],
    *,
    adapter: Path | None = None,
    dtype: str = "float32",
    ini: str = "",
) -> None:
    """``memeval_project``'s layout plus a profile ``fam`` over ``model`` (and ``adapter``)."""
    adapter_line = f'adapter = "{adapter.as_posix()}"' if adapter else ""
    project.write(
        records,
        ini=ini,
        profiles=f"""
        [tool.memeval.ckpt.fam]
        model = "{model.as_posix()}"
        {adapter_line}
        benchmark = "bench.jsonl"
        generation = {{ max_new_tokens = {MAX_NEW}, dtype = "{dtype}" }}
        """,
    )


def test_gemma_template_rejecting_the_system_role_is_one_error_before_the_run(
    memeval_project: MemevalProject, built: Built
) -> None:
    records = family_records(FAMILIES["llama3"], "baseline", "val", 3)  # with system messages
    write_project(memeval_project, built.model("gemma"), records)
    result = memeval_project.run("--ckpt", "fam")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str() + result.stdout.str()
    assert text.count("System role not supported") == 1
    assert "rejects 3 of 3 scenario(s); nothing was evaluated" in text
    assert "'s0001'" in text and "'s0003'" in text
    assert "Traceback" not in text
    assert not (memeval_project.path / "runs").exists()


def test_mistral_alternation_error_names_the_one_bad_scenario(
    memeval_project: MemevalProject, built: Built
) -> None:
    records = val_records("mistral", 3)
    messages = records[1]["messages"]
    # Two user messages in a row: Mistral v1's template refuses the conversation.
    bad = {**records[1], "id": "odd one/ü", "messages": [messages[0], *messages]}
    write_project(memeval_project, built.model("mistral"), [records[0], bad, records[2]])
    result = memeval_project.run("-n", "2", "--ckpt", "fam")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str() + result.stdout.str()
    assert "rejects 1 of 3 scenario(s)" in text
    assert "Conversation roles must alternate user/assistant/user/assistant/..." in text
    assert "'odd one/ü'" in text and "'s0001'" not in text
    assert "Traceback" not in text


def test_reasoning_template_breaks_the_prefix_property_and_the_fast_path_falls_back(
    built: Built, tmp_path: Path
) -> None:
    """Earlier turns lose their ``<think>`` block in history while the generation prompt opens
    one: multi-turn scenarios fall back to the reference path (and say why), a single-turn
    scenario keeps the fast path; every output equals the plain loop."""
    model_dir = copy_family(
        built.model("qwen2.5"), tmp_path / "thinking", template=QWEN_THINKING_TEMPLATE
    )
    records = val_records("qwen2.5", 2)
    single = {
        "id": "single",
        "messages": [records[0]["messages"][0], *records[0]["messages"][-2:]],
    }
    scenarios = scenarios_of([*records, single])
    model, tok = load_plain(model_dir)
    expected = [plain_loop(model, tok, s.messages, MAX_NEW) for s in scenarios]
    loaded = load_model(model_dir, None)
    fast = FastDecoder(loaded, MAX_NEW).decode(scenarios)
    reference = [ReferenceDecoder(loaded, MAX_NEW).rollout(s) for s in scenarios]
    assert [rollout_outputs(r) for r in fast] == expected
    assert [rollout_outputs(r) for r in reference] == expected
    for rollout in fast[:2]:
        assert (
            rollout.notes and "is not a token prefix of the whole conversation" in rollout.notes[0]
        )
    assert not fast[2].notes


# --------------------------------------------------------------------------- context length
def test_context_limit_reads_config_and_tokenizer(built: Built, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    gpt2 = copy_family(built.model("gpt2"), tmp_path / "gpt2")
    edit_json(gpt2 / "config.json", n_positions=300)
    limit = context_limit(gpt2, AutoTokenizer.from_pretrained(str(gpt2)))
    assert limit is not None and limit.tokens == 300 and "n_positions" in limit.source
    edit_json(gpt2 / "tokenizer_config.json", model_max_length=200)
    limit = context_limit(gpt2, AutoTokenizer.from_pretrained(str(gpt2)))
    assert limit is not None and limit.tokens == 200 and "model_max_length" in limit.source


def overlong_setup(built: Built, where: Path) -> tuple[Path, list[dict[str, Any]], int]:
    """A Llama-3 copy built for fewer positions than some scenarios need; returns it, the
    records and the limit (between the shortest and the longest scenario)."""
    model = copy_family(built.model("llama3"), where / "short-llama")
    records = val_records("llama3", 4)
    lengths = sorted(
        len(scenario_prompts(load_plain_tokenizer(model), s)[1]) for s in scenarios_of(records)
    )
    limit = (lengths[0] + lengths[-1]) // 2
    edit_json(model / "config.json", max_position_embeddings=limit)
    return model, records, limit


def load_plain_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def test_overlong_scenarios_are_refused_before_the_run(
    memeval_project: MemevalProject, built: Built
) -> None:
    model, records, limit = overlong_setup(built, memeval_project.path)
    scenarios = scenarios_of(records)
    result = preflight(model, scenarios, max_new_tokens=MAX_NEW, allow_overlong=True)
    over = {o.scenario_id: o.tokens for o in result.overlong}
    assert over and len(over) < len(records) and all(n > limit for n in over.values())
    write_project(memeval_project, model, records)
    run = memeval_project.run("--ckpt", "fam")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    text = run.stderr.str() + run.stdout.str()
    assert f"longer than the model's context of {limit} tokens" in text
    assert "max_position_embeddings" in text and "--memeval-allow-overlong" in text
    for sid, tokens in over.items():
        assert f"'{sid}' ({tokens} tokens)" in text
    assert not (memeval_project.path / "runs").exists()


@pytest.mark.slow
def test_overlong_scenarios_evaluated_on_request_are_flagged(
    memeval_project: MemevalProject, built: Built
) -> None:
    model, records, limit = overlong_setup(built, memeval_project.path)
    over = {
        o.scenario_id: o.tokens
        for o in preflight(
            model, scenarios_of(records), max_new_tokens=MAX_NEW, allow_overlong=True
        ).overlong
    }
    write_project(memeval_project, model, records, ini="memeval_allow_overlong = true")
    run = memeval_project.run("-n", "2", "--ckpt", "fam")
    assert run.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    run.stdout.fnmatch_lines(
        [
            f"memeval: WARNING: {len(over)} scenario(s) longer than the model's context of "
            f"{limit} tokens*",
            f"over-long: {len(over)} scenario(s)*; their records say overlong",
        ]
    )
    # Counted in metrics.json (and recounted), and shown with the run's counts.
    assert memeval_project.metrics("fam")["overlong"] == len(over) > 0
    run.stdout.fnmatch_lines([f"overlong: {len(over)}/{len(records)} scenarios were evaluated*"])
    for record in memeval_project.predictions("fam"):
        if record["id"] in over:
            assert record["overlong"] == {"tokens": over[record["id"]], "limit": limit}
        else:
            assert "overlong" not in record


# --------------------------------------------------------------------------- adapters
ADAPTER_CASES = ["llama3", "qwen2.5", "phi", "gpt2", "demo-neox"]


@pytest.mark.parametrize("name", ADAPTER_CASES)
def test_lora_adapters_on_each_module_naming_load_and_apply(
    name: str, built: Built, tmp_path: Path
) -> None:
    """q_proj/v_proj (+ embed_tokens or lm_head saved whole), Phi-3's fused qkv_proj, GPT-2's
    Conv1D c_attn (fan_in_fan_out) and GPT-NeoX's fused query_key_value: the pre-run fit check
    accepts each, peft applies it, and it changes predictions."""
    import torch
    from safetensors.torch import load_file

    if name == "demo-neox":
        model_dir = BASE_MODEL
        # The demo model is trained for longer (larger logits): a full-size random adapter.
        adapter = build_adapter(model_dir, tmp_path / "neox", ["query_key_value"], scale=1.0)
        family = None
    else:
        model_dir, adapter, family = built.model(name), built.adapter(name), FAMILIES[name]
    check_adapter_fits(model_dir, adapter)
    scenario = scenarios_of(val_records(name if family else "llama3", 1))[0]
    base = load_model(model_dir, None)
    tuned = load_model(model_dir, adapter)
    base_out = rollout_outputs(ReferenceDecoder(base, MAX_NEW).rollout(scenario))
    tuned_out = rollout_outputs(ReferenceDecoder(tuned, MAX_NEW).rollout(scenario))
    assert tuned_out != base_out
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    full_copies = [k for k in saved if "lora_" not in k]
    wanted = family.modules_to_save if family else ()
    assert {k.split(".")[-2] for k in full_copies} == set(wanted)
    params = dict(tuned.model.named_parameters())
    for key in full_copies:
        module = key.removeprefix("base_model.model.").rsplit(".", 1)[0]
        active = params[f"base_model.model.{module}.modules_to_save.default.weight"]
        original = params[f"base_model.model.{module}.original_module.weight"]
        assert torch.equal(active, saved[key]) and not torch.equal(active, original)


# --------------------------------------------------------------------------- end to end
# (family, decode path, xdist workers, with its adapter): every family in a real pytest run,
# both decode paths, with and without xdist, compared with the plain loop.
E2E = [
    ("llama3", "fast", 2, True),
    ("llama3", "reference", 0, True),
    ("qwen2.5", "fast", 0, True),
    ("qwen2.5", "reference", 2, True),
    ("mistral", "fast", 2, False),
    ("gemma", "fast", 0, False),
    ("phi", "fast", 0, True),
    ("gpt2", "fast", 2, True),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "decode", "workers", "with_adapter"),
    E2E,
    ids=[f"{n}-{d}-n{w}" for n, d, w, _ in E2E],
)
def test_plugin_run_predicts_what_the_plain_loop_predicts(
    memeval_project: MemevalProject,
    built: Built,
    name: str,
    decode: str,
    workers: int,
    with_adapter: bool,
) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model_dir = built.model(name)
    adapter = built.adapter(name) if with_adapter else None
    records = val_records(name, 4)
    model, tok = load_plain(model_dir, adapter)
    expected = {r["id"]: plain_loop(model, tok, r["messages"], MAX_NEW) for r in records}
    torch.set_num_threads(threads)
    write_project(memeval_project, model_dir, records, adapter=adapter)
    run = memeval_project.run("-n", str(workers), "--ckpt", "fam", "--memeval-decode", decode)
    assert run.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), run.stdout.str()
    predictions = memeval_project.predictions("fam")
    assert [r["id"] for r in predictions] == list(expected)
    for record in predictions:
        assert record["decode"] == decode
        assert record_outputs(record) == expected[record["id"]], record["id"]
    metrics = memeval_project.metrics("fam")
    assert metrics["fingerprints"]["model"] == fingerprint_dir(model_dir)
    assert metrics["fingerprints"]["adapter"] == (fingerprint_dir(adapter) if adapter else None)
    assert sum(stop for turns in expected.values() for _, stop in turns) > 0


def test_fixture_loader_agrees_with_plugin_loader(built: Built) -> None:
    """The loaded stop ids are the generation config's list, which differs from the
    tokenizer's eos for these families (what the stop-id cases rely on)."""
    for name in ("llama3", "qwen2.5", "gemma", "phi"):
        loaded: LoadedModel = load_model(built.model(name), None)
        config = json.loads((built.model(name) / "generation_config.json").read_text("utf-8"))
        assert list(loaded.stop_ids) == config["eos_token_id"]
        assert [loaded.tokenizer.eos_token_id] != config["eos_token_id"]
