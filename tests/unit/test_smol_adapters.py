"""The second demo's committed SmolLM2 adapters and their profiles, checked without the GGUF.

The base model (``demo/real/SmolLM2-135M-Instruct.Q4_1.gguf``) is fetched, not committed, so
these checks read only the adapter files: a LoRA of the shape SmolLM2-135M takes (30 layers,
hidden 576, 3 KV heads of 64), safetensors only, small, trained (``lora_B`` starts at zero),
and the ``smol-*`` profiles evaluate them on the benchmarks of ``baseline`` / ``oracle``; the
``twc`` adapter (trained on TextWorld Express gold paths of the train fold) is evaluated three
ways on the test fold's seeds by the ``twc-*`` profiles.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from pytest_memeval.core.profiles import resolve_profile

from ..conftest import REPO

ADAPTERS = REPO / "demo" / "checkpoint" / "smol-adapters"
GGUF = "demo/real/SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2-135M: q/o map 576 -> 576; k/v map 576 -> 3 KV heads x 64.
OUT_FEATURES = {"q_proj": 576, "k_proj": 192, "v_proj": 192, "o_proj": 576}
LAYERS = 30


@pytest.mark.parametrize("variant", ["baseline", "oracle", "twc"])
def test_adapter_is_a_small_trained_smollm2_lora(variant: str) -> None:
    adapter = ADAPTERS / variant
    assert sorted(p.name for p in adapter.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    weights = adapter / "adapter_model.safetensors"
    assert weights.stat().st_size < 5_000_000
    cfg = json.loads((adapter / "adapter_config.json").read_text("utf-8"))
    assert cfg["peft_type"] == "LORA"
    assert cfg["base_model_name_or_path"] == GGUF
    assert cfg["target_modules"] == sorted(OUT_FEATURES)
    rank = cfg["r"]
    with safe_open(str(weights), "pt") as f:
        keys = set(f.keys())
        expected = {
            f"base_model.model.model.layers.{i}.self_attn.{m}.lora_{ab}.weight"
            for i in range(LAYERS)
            for m in OUT_FEATURES
            for ab in "AB"
        }
        assert keys == expected
        for i in range(LAYERS):
            for module, out in OUT_FEATURES.items():
                stem = f"base_model.model.model.layers.{i}.self_attn.{module}"
                a = f.get_tensor(f"{stem}.lora_A.weight")
                b = f.get_tensor(f"{stem}.lora_B.weight")
                assert (a.shape, b.shape) == ((rank, 576), (out, rank)), stem
                assert a.dtype == b.dtype == torch.float32
                assert bool(torch.isfinite(a).all() and torch.isfinite(b).all()), stem
                assert float(b.abs().max()) > 0, f"{stem}: lora_B still zero (untrained)"


def test_smol_profiles_use_the_gguf_and_the_demo_benchmarks() -> None:
    path = REPO / "pyproject.toml"
    for name, tiny, adapter in [
        ("smol-baseline", "baseline", "baseline"),
        ("smol-oracle", "oracle", "oracle"),
        ("smol", "oracle", None),
    ]:
        profile = resolve_profile(name, path)
        reference = resolve_profile(tiny, path)
        assert profile.model == (REPO / GGUF).resolve()
        assert profile.adapter == ((ADAPTERS / adapter).resolve() if adapter else None)
        assert profile.benchmark == reference.benchmark
        assert profile.generation == reference.generation


def test_twc_profiles_evaluate_one_adapter_and_the_base_on_the_same_seeds_three_ways() -> None:
    """``twc-{adapter,zero-shot}-gold`` (teacher-forced; free-running with --memeval-history
    model) and ``-loop`` (closed loop): the same game, parameters, fold and seeds, the same
    generation, on the test fold (the adapter was trained on the train fold's gold paths)."""
    path = REPO / "pyproject.toml"
    trained = [json.loads(line)["meta"] for line in (REPO / "demo/data/twc/train.jsonl").open()]
    assert {m["fold"] for m in trained} == {"train"}
    for who, adapter in (("adapter", (ADAPTERS / "twc").resolve()), ("zero-shot", None)):
        gold = resolve_profile(f"twc-{who}-gold", path)
        loop = resolve_profile(f"twc-{who}-loop", path)
        assert gold.model == loop.model == (REPO / GGUF).resolve()
        assert gold.adapter == loop.adapter == adapter
        assert gold.generation == loop.generation
        options = gold.benchmark.options
        assert loop.env is not None and gold.benchmark.builder == "twc_gold"
        assert (loop.env.game, loop.env.fold, loop.env.params_text) == (
            "twc",
            options["fold"],
            ",".join(sorted(options["params"].split(","))),
        )
        assert options["fold"] == "test" and list(loop.env.seeds) == list(range(20))
        assert options["seeds"] == "0-19"
        assert trained[0]["params"] == loop.env.params_text
