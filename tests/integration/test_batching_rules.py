"""The conversation lengths the batching rules' unit test plans over
(``tests/unit/data/batch_plans.json``) are the benchmark's as the tokenizers count them today:
the demo's always, SmolLM2's where its GGUF file is present (tokenizer only, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_memeval.core.builders import build_bundled, load_profile_benchmark
from pytest_memeval.core.profiles import resolve_profile
from pytest_memeval.model.prompts import conversation_ids

from ..conftest import REPO

DATA = json.loads((REPO / "tests" / "unit" / "data" / "batch_plans.json").read_text())


def _lengths(profile_name: str, tokenizer: object) -> list[int]:
    profile = resolve_profile(profile_name, REPO / "pyproject.toml")
    scenarios = load_profile_benchmark(profile, build_bundled).scenarios
    return [len(conversation_ids(tokenizer, s)) for s in scenarios]


def test_the_demo_lengths_are_the_tokenizers() -> None:
    from transformers import AutoTokenizer

    profile = resolve_profile("oracle", REPO / "pyproject.toml")
    tokenizer = AutoTokenizer.from_pretrained(str(profile.model_dir), local_files_only=True)
    assert _lengths("oracle", tokenizer) == DATA["lengths"]["demo"]


@pytest.mark.slow
def test_the_smollm2_lengths_are_its_tokenizers() -> None:
    profile = resolve_profile("smol-oracle", REPO / "pyproject.toml")
    gguf = profile.model
    if gguf is None or not Path(gguf).is_file():
        pytest.skip(f"the SmolLM2 file {gguf} is absent (memeval fetch)")
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    assert _lengths("smol-oracle", tokenizer) == DATA["lengths"]["smol"]
