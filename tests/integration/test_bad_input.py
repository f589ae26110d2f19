"""Bad input: one clear message naming the file and line (or scenario), a non-zero exit, and
no run directory written. Each case is a real pytest run of a pytester project (in-process:
every one of these is refused at configure time, before any model loads)."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.model.checks import (
    CheckpointError,
    adapter_mismatches,
    check_adapter_fits,
    check_model_dir,
    safetensors_shapes,
)
from pytest_memeval.model.loading import load_model

from ..conftest import ADAPTERS, BASE_MODEL, MemevalProject, demo_records


def _line(obj: Any) -> bytes:
    return (json.dumps(obj) + "\n").encode("utf-8")


def _good(n: int = 2) -> list[dict[str, Any]]:
    return demo_records("oracle", n)


def _with(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(record))
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


_DROP = object()


class _Unpickled:
    """Unpickling this creates ``marker``: proof of whether a loader ran pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _pickle_weights(directory: Path, names: list[str], marker: Path) -> None:
    for name in names:
        (directory / name).write_bytes(pickle.dumps(_Unpickled(marker)))


@dataclass
class Case:
    """``setup`` lays out the bad input and returns the pytest arguments; ``message`` must
    appear exactly once in the run's stderr."""

    setup: Callable[[MemevalProject, dict[str, Path]], list[str]]
    message: str


def _bench(lines: list[bytes]) -> Callable[[MemevalProject, dict[str, Path]], list[str]]:
    def setup(project: MemevalProject, _: dict[str, Path]) -> list[str]:
        (project.path / "bench.jsonl").write_bytes(b"".join(lines))
        return ["--ckpt", "demo"]

    return setup


def _messages(record: dict[str, Any], messages: list[dict[str, Any]]) -> bytes:
    return _line(_with(record, messages=messages))


def _profile(
    toml: str, ckpt: str = "bad"
) -> Callable[[MemevalProject, dict[str, Path]], list[str]]:
    def setup(project: MemevalProject, dirs: dict[str, Path]) -> list[str]:
        text = toml.format(
            base=BASE_MODEL.as_posix(),
            adapter=(ADAPTERS / "oracle").as_posix(),
            **{k: v.as_posix() for k, v in dirs.items()},
        )
        path = project.path / "pyproject.toml"
        path.write_text(path.read_text("utf-8") + text, "utf-8")
        return ["--ckpt", ckpt]

    return setup


G0, G1 = _good()
CASES: dict[str, Case] = {
    "malformed-json-line": Case(
        _bench([_line(G0), b'{"id": "x", "messages": [\n']), "bench.jsonl:2: malformed JSON"
    ),
    "line-not-an-object": Case(
        _bench([_line(G0), b"[1, 2]\n"]),
        "bench.jsonl:2: a scenario must be a JSON object, got list",
    ),
    "missing-field": Case(
        _bench([_line(G0), _line(_with(G1, messages=_DROP))]),
        f"bench.jsonl:2 (scenario '{G1['id']}'): field 'messages' is missing",
    ),
    "wrongly-typed-id": Case(
        _bench([_line(_with(G0, id=7))]),
        "bench.jsonl:1: field 'id' is missing or not a non-empty string",
    ),
    "wrongly-typed-content": Case(
        _bench([_messages(G0, [*G0["messages"][:-1], {"role": "assistant", "content": 5}])]),
        f"(scenario '{G0['id']}'): messages[{len(G0['messages']) - 1}].content is missing or not",
    ),
    "unknown-role": Case(
        _bench([_line(G0), _messages(G1, [{"role": "tool", "content": "x"}, *G1["messages"]])]),
        f"bench.jsonl:2 (scenario '{G1['id']}'): messages[0] has unknown role 'tool'",
    ),
    "no-assistant-turn": Case(
        _bench([_messages(G0, [m for m in G0["messages"] if m["role"] != "assistant"])]),
        f"bench.jsonl:1 (scenario '{G0['id']}'): the conversation has no assistant turn",
    ),
    "ends-on-user-turn": Case(
        _bench([_messages(G0, [*G0["messages"], {"role": "user", "content": "and?"}])]),
        f"bench.jsonl:1 (scenario '{G0['id']}'): the conversation ends on a 'user' message",
    ),
    "duplicate-ids": Case(
        _bench([_line(G0), _line(G1), _line(_with(G1, memory_chain=[]))]),
        f"bench.jsonl:3: duplicate scenario id '{G1['id']}' (first seen at ",
    ),
    "empty-benchmark": Case(
        _bench([b"\n", b"  \n"]), "bench.jsonl: the benchmark has no scenarios"
    ),
    "not-utf8": Case(
        _bench([_line(G0), _line(G1).replace(b"objects", b"obj\xe9cts")]),
        "bench.jsonl:2: not valid UTF-8",
    ),
    # A BOM is refused, not stripped: training files are compared byte for byte.
    "utf8-bom": Case(
        _bench([b"\xef\xbb\xbf" + _line(G0)]),
        "bench.jsonl:1: file starts with a UTF-8 byte-order mark",
    ),
    "unknown-ckpt": Case(lambda p, d: ["--ckpt", "nope"], "unknown --ckpt 'nope'"),
    "profile-missing-model": Case(
        _profile('\n[tool.memeval.ckpt.bad]\nbenchmark = "bench.jsonl"\n'),
        "[tool.memeval.ckpt.bad]: missing required key 'model'",
    ),
    "profile-missing-benchmark": Case(
        _profile('\n[tool.memeval.ckpt.bad]\nmodel = "{base}"\n'),
        "[tool.memeval.ckpt.bad]: missing required key 'benchmark'",
    ),
    "missing-model-dir": Case(
        _profile('\n[tool.memeval.ckpt.bad]\nmodel = "no/such/model"\nbenchmark = "bench.jsonl"\n'),
        "model directory not found: ",
    ),
    "missing-adapter-dir": Case(
        _profile(
            '\n[tool.memeval.ckpt.bad]\nmodel = "{base}"\nadapter = "no/such/adapter"\n'
            'benchmark = "bench.jsonl"\n'
        ),
        "adapter directory not found: ",
    ),
    "adapter-for-other-shapes": Case(
        _profile(
            '\n[tool.memeval.ckpt.bad]\nmodel = "{base}"\nadapter = "{narrow}"\n'
            'benchmark = "bench.jsonl"\n'
        ),
        "gpt_neox.layers.0.attention.query_key_value: adapter expects a 96x32 weight, base "
        "model has 192x64",
    ),
    "adapter-for-other-modules": Case(
        _profile(
            '\n[tool.memeval.ckpt.bad]\nmodel = "{base}"\nadapter = "{llama}"\n'
            'benchmark = "bench.jsonl"\n'
        ),
        "model.layers.0.self_attn.q_proj: no such module in the base model",
    ),
    "pickle-only-model": Case(
        _profile('\n[tool.memeval.ckpt.bad]\nmodel = "{pickled}"\nbenchmark = "bench.jsonl"\n'),
        "no .safetensors weights (found: model.pt, pytorch_model.bin); pickle checkpoints are "
        "refused and never unpickled",
    ),
    "pickle-only-adapter": Case(
        _profile(
            '\n[tool.memeval.ckpt.bad]\nmodel = "{base}"\nadapter = "{pickled_adapter}"\n'
            'benchmark = "bench.jsonl"\n'
        ),
        "no adapter_model.safetensors (found: adapter_model.bin); pickle adapters are refused",
    ),
    "remote-code-model": Case(
        _profile('\n[tool.memeval.ckpt.bad]\nmodel = "{remote}"\nbenchmark = "bench.jsonl"\n'),
        "the model needs remote code (auto_map ['AutoModelForCausalLM'])",
    ),
}


def _copy_base(dest: Path) -> Path:
    shutil.copytree(BASE_MODEL, dest)
    return dest


def _peft_adapter(dest: Path, config: Any, targets: list[str]) -> Path:
    """A real LoRA adapter, saved by peft, for a tiny model built from ``config``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_config(config)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
    peft_model.save_pretrained(str(dest))
    assert (dest / "adapter_model.safetensors").is_file()
    return dest


@pytest.fixture(scope="module")
def bad_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoint directories that must be refused: foreign adapters, pickles, remote code."""
    from transformers import GPTNeoXConfig, LlamaConfig

    root = tmp_path_factory.mktemp("bad_ckpts")
    base_cfg = json.loads((BASE_MODEL / "config.json").read_text("utf-8"))
    narrow = GPTNeoXConfig(**{**base_cfg, "hidden_size": 32, "intermediate_size": 128})
    llama = LlamaConfig(
        vocab_size=53,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    dirs = {
        "narrow": _peft_adapter(root / "narrow", narrow, ["query_key_value", "dense_h_to_4h"]),
        "llama": _peft_adapter(root / "llama", llama, ["q_proj", "v_proj"]),
        "pickled": root / "pickled",
        "pickled_adapter": root / "pickled_adapter",
        "remote": _copy_base(root / "remote"),
        "marker": root / "UNPICKLED",
    }
    dirs["pickled"].mkdir()
    shutil.copy(BASE_MODEL / "config.json", dirs["pickled"] / "config.json")
    _pickle_weights(dirs["pickled"], ["pytorch_model.bin", "model.pt"], dirs["marker"])
    dirs["pickled_adapter"].mkdir()
    shutil.copy(ADAPTERS / "oracle" / "adapter_config.json", dirs["pickled_adapter"])
    _pickle_weights(dirs["pickled_adapter"], ["adapter_model.bin"], dirs["marker"])
    cfg = dirs["remote"] / "config.json"
    cfg.write_text(
        json.dumps({**base_cfg, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}}),
        "utf-8",
    )
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_one_clear_usage_error_and_writes_nothing(
    case: str, memeval_project: MemevalProject, bad_dirs: dict[str, Path]
) -> None:
    memeval_project.write(_good())
    args = CASES[case].setup(memeval_project, bad_dirs)
    result = memeval_project.pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    err = result.stderr.str()
    assert err.count(CASES[case].message) == 1, err
    assert err.count("ERROR: ") == 1, err  # one message, not a traceback
    assert "Traceback" not in err + result.stdout.str()
    assert not (memeval_project.path / "runs").exists(), "nothing may be written"
    assert not bad_dirs["marker"].exists(), "a pickle was unpickled"


# -- the checks behind those messages, called directly ------------------------------------


def test_the_pickle_marker_would_fire_if_unpickled(tmp_path: Path) -> None:
    """Control for the 'never unpickled' assertions: unpickling really creates the marker."""
    marker = tmp_path / "fired"
    pickle.loads(pickle.dumps(_Unpickled(marker)))
    assert marker.exists()


@pytest.mark.slow
def test_load_model_refuses_pickle_weights_without_unpickling(bad_dirs: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match="pickle checkpoints are refused"):
        load_model(bad_dirs["pickled"], None)
    with pytest.raises(CheckpointError, match="pickle adapters are refused"):
        load_model(BASE_MODEL, bad_dirs["pickled_adapter"])
    assert not bad_dirs["marker"].exists()
    with pytest.raises(CheckpointError, match="needs remote code"):
        check_model_dir(bad_dirs["remote"])


@pytest.mark.slow
def test_foreign_adapters_are_refused_from_headers(bad_dirs: dict[str, Path]) -> None:
    check_adapter_fits(BASE_MODEL, ADAPTERS / "oracle")  # the demo's own adapter fits
    with pytest.raises(CheckpointError) as narrow:
        check_adapter_fits(BASE_MODEL, bad_dirs["narrow"])
    # GPT-NeoX with hidden size 32: query_key_value is 96x32 there, 192x64 here.
    assert (
        "gpt_neox.layers.0.attention.query_key_value: adapter expects a 96x32 weight, base "
        "model has 192x64" in str(narrow.value)
    )
    with pytest.raises(CheckpointError) as llama:
        check_adapter_fits(BASE_MODEL, bad_dirs["llama"])
    assert "model.layers.0.self_attn.q_proj: no such module in the base model" in str(llama.value)
    # load_model refuses before loading any weight.
    with pytest.raises(CheckpointError, match="adapter does not fit the base model"):
        load_model(BASE_MODEL, bad_dirs["llama"])


@pytest.mark.slow
def test_header_shapes_are_the_safetensors_library_shapes(
    bad_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors import safe_open

    for file in (
        BASE_MODEL / "model.safetensors",
        bad_dirs["narrow"] / "adapter_model.safetensors",
    ):
        with safe_open(str(file), framework="pt") as fh:
            expected = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
        assert safetensors_shapes([file]) == expected
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match=r"broken.safetensors: unreadable safetensors header"):
        safetensors_shapes([broken])


def test_adapter_shape_rules() -> None:
    base = {"h.0.attn.c_attn.weight": (64, 192), "wte.weight": (50, 64), "h.0.ln.weight": (64,)}
    conv1d = {
        "base_model.model.h.0.attn.c_attn.lora_A.weight": (4, 64),
        "base_model.model.h.0.attn.c_attn.lora_B.weight": (192, 4),
    }
    # GPT-2's Conv1D stores (in, out): fits only with fan_in_fan_out.
    assert adapter_mismatches(base, conv1d, fan_in_fan_out=True) == []
    assert adapter_mismatches(base, conv1d) == [
        "h.0.attn.c_attn: adapter expects a 192x64 weight, base model has 64x192"
    ]
    embedding = {
        "base_model.model.wte.lora_embedding_A": (4, 50),
        "base_model.model.wte.lora_embedding_B": (64, 4),
    }
    assert adapter_mismatches(base, embedding) == []
    assert adapter_mismatches(base, {"base_model.model.wte.weight": (51, 64)}) == [
        "wte.weight: adapter [51, 64], base model [50, 64]"
    ]
    tied = {"base_model.model.lm_head.lora_A.weight": (4, 64)}
    assert adapter_mismatches(base, tied, base_config={"tie_word_embeddings": True}) == []
    assert adapter_mismatches(base, tied, base_config={"tie_word_embeddings": False}) == [
        "lm_head: no such module in the base model"
    ]
