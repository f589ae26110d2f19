"""Checkpoint profiles: resolution and the errors a user sees."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_memeval.core.profiles import (
    ProfileError,
    apply_overrides,
    profile_from_plain,
    profile_to_plain,
    resolve_profile,
)

from ..conftest import REPO


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_repository_profiles_resolve() -> None:
    oracle = resolve_profile("oracle", REPO / "pyproject.toml")
    assert oracle.kind == "model"
    assert oracle.model == (REPO / "demo/checkpoint/base").resolve()
    assert oracle.adapter == (REPO / "demo/checkpoint/adapters/oracle").resolve()
    assert oracle.benchmark.builder == "scene_memory"
    assert "init_state_manifest" in oracle.benchmark.options
    baseline = resolve_profile("baseline", REPO / "pyproject.toml")
    assert "init_state_manifest" not in baseline.benchmark.options
    replay = resolve_profile("oracle-replay", REPO / "pyproject.toml")
    assert replay.kind == "replay" and replay.predictions is not None


def test_unknown_profile_lists_known_ones(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [tool.memeval.ckpt.a]
        model = "m"
        benchmark = "b.jsonl"
        [tool.memeval.ckpt.b]
        model = "m"
        benchmark = "b.jsonl"
        """,
    )
    with pytest.raises(ProfileError, match=r"unknown --ckpt 'zz'.*\(known: a, b\)"):
        resolve_profile("zz", path)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('benchmark = "b.jsonl"', "missing required key 'model'"),
        ('model = "m"', "missing required key 'benchmark'"),
        ('model = "m"\nbenchmark = "b.jsonl"\nadaptor = "x"', "unknown key(s) ['adaptor']"),
        (
            'model = "m"\nbenchmark = "b.jsonl"\ngeneration = { max_new_token = 3 }',
            "unknown generation key(s)",
        ),
        (
            'model = "m"\nbenchmark = "b.jsonl"\ngeneration = { max_new_tokens = 0 }',
            "positive integer",
        ),
        ('model = "m"\nbenchmark = { tasks = "t" }', "needs a 'builder' name"),
        ('kind = "replay"\nbenchmark = "b.jsonl"', "missing required key 'predictions'"),
        ('kind = "weird"\nbenchmark = "b.jsonl"', "kind must be 'model' or 'replay'"),
        ('model = "m"\nbenchmark = "b.jsonl"\ntokenizer = 3', "'tokenizer' must be a path string"),
        ('kind = "replay"\npredictions = "p"\nbenchmark = "b"\ntokenizer = "t"', "unknown key"),
    ],
)
def test_malformed_profiles_name_file_profile_and_key(
    tmp_path: Path, body: str, needle: str
) -> None:
    path = write(tmp_path, "[tool.memeval.ckpt.p]\n" + body + "\n")
    with pytest.raises(ProfileError) as info:
        resolve_profile("p", path)
    message = str(info.value)
    assert str(path) in message and "[tool.memeval.ckpt.p]" in message and needle in message


def test_paths_resolve_relative_to_the_profile_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [tool.memeval.ckpt.p]
        model = "models/base"
        adapter = "models/lora"
        benchmark = "data/val.jsonl"
        generation = { max_new_tokens = 8, dtype = "bfloat16" }
        parse = { final = "[a-z_]+" }
        """,
    )
    p = resolve_profile("p", path)
    assert p.model == tmp_path / "models/base"
    assert p.adapter == tmp_path / "models/lora"
    assert p.benchmark.path == tmp_path / "data/val.jsonl"
    assert p.generation.max_new_tokens == 8 and p.generation.dtype == "bfloat16"
    assert p.parse.final == "[a-z_]+" and p.parse.turn is None


def test_a_gguf_model_a_tokenizer_and_the_conversion_travel_to_workers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [tool.memeval.ckpt.p]
        model = "models/smol model.Q4_1.gguf"
        tokenizer = "tokenizers/smol"
        benchmark = "data/val.jsonl"
        """,
    )
    p = resolve_profile("p", path)
    assert p.model == tmp_path / "models/smol model.Q4_1.gguf"
    assert p.tokenizer == p.tokenizer_dir == tmp_path / "tokenizers/smol"
    assert p.converted is None and p.model_dir == p.model  # not converted yet
    converted = replace(p, converted=tmp_path / "cache/gguf/ab12")
    assert converted.model_dir == tmp_path / "cache/gguf/ab12"
    assert profile_from_plain(profile_to_plain(converted)) == converted
    # Another model on the command line: the profile's conversion is not its conversion.
    other, _ = apply_overrides(converted, model=tmp_path / "other.gguf")
    assert other.converted is None and other.model_dir == tmp_path / "other.gguf"
