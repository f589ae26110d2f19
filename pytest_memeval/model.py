"""Checkpoint loading: a base model directory plus an optional PEFT adapter, safetensors only.

Security rules enforced here, before transformers sees a file:

* weights must be ``*.safetensors``; a directory holding only pickle weights (``.bin``, ``.pt``,
  ``.pth``, ``.ckpt``, ``.pkl``) is refused and never unpickled;
* ``trust_remote_code`` is always off; a config that needs remote code (``auto_map``) is
  refused with a clear message instead of a transformers traceback.

torch, transformers and peft are imported inside the functions so that importing the plugin
(``pytest --help``, model-free contracts) stays fast.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointError",
    "LoadedModel",
    "check_adapter_dir",
    "check_model_dir",
    "fingerprint_dir",
    "load_model",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class CheckpointError(RuntimeError):
    """A model or adapter directory cannot be loaded safely; the message says which and why."""


def _weights(directory: Path) -> tuple[list[Path], list[Path]]:
    files = [p for p in sorted(directory.iterdir()) if p.is_file()]
    safe = [p for p in files if p.suffix == ".safetensors"]
    pickled = [p for p in files if p.suffix in PICKLE_SUFFIXES]
    return safe, pickled


def check_model_dir(path: Path) -> None:
    """Refuse a base-model directory that is missing, pickle-only or needs remote code."""
    if not path.is_dir():
        raise CheckpointError(f"model directory not found: {path}")
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"{path}: no config.json (not a transformers model directory)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{config}: unreadable config ({exc})") from None
    if isinstance(data, dict) and "auto_map" in data:
        raise CheckpointError(
            f"{config}: the model needs remote code (auto_map {sorted(data['auto_map'])}); "
            "pytest-memeval never runs checkpoint code (trust_remote_code is off)"
        )
    safe, pickled = _weights(path)
    if not safe:
        found = ", ".join(p.name for p in pickled) or "none"
        raise CheckpointError(
            f"{path}: no .safetensors weights (found: {found}); pickle checkpoints are refused "
            "and never unpickled. Convert them with safetensors first."
        )


def check_adapter_dir(path: Path) -> None:
    """Refuse an adapter directory that is missing or has no safetensors adapter weights."""
    if not path.is_dir():
        raise CheckpointError(f"adapter directory not found: {path}")
    if not (path / "adapter_config.json").is_file():
        raise CheckpointError(f"{path}: no adapter_config.json (not a PEFT adapter directory)")
    if not (path / "adapter_model.safetensors").is_file():
        _, pickled = _weights(path)
        found = ", ".join(p.name for p in pickled) or "none"
        raise CheckpointError(
            f"{path}: no adapter_model.safetensors (found: {found}); pickle adapters are "
            "refused and never unpickled"
        )


def fingerprint_dir(path: Path) -> str:
    """SHA-256 over every regular file of ``path`` (names and bytes), in sorted order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel.startswith(".") or "/." in rel or "__pycache__" in rel:
            continue
        digest.update(rel.encode("utf-8") + b"\0")
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


@dataclass
class LoadedModel:
    """A model ready for greedy decoding, its tokenizer and the ids that end a turn."""

    model: Any
    tokenizer: Any
    stop_ids: tuple[int, ...]
    pad_id: int
    device: str
    dtype: str


def _stop_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise CheckpointError("the model defines no eos_token_id: a turn could never end")
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def load_model(
    model_dir: Path,
    adapter_dir: Path | None,
    *,
    dtype: str = "float32",
    attn_implementation: str = "eager",
    device: str = "cpu",
    device_map: str | dict[str, Any] | None = None,
) -> LoadedModel:
    """Load base model, tokenizer and adapter for evaluation (eval mode, no gradients).

    ``device_map`` (or ``device="auto"``, which means ``device_map="auto"``) spreads the model
    over several devices as accelerate does (a model larger than one GPU; the worker of
    ``--memeval-gpus-per-worker K`` sees exactly its K GPUs); inputs then go to the device of
    the input embeddings.
    """
    if device == "auto" and device_map is None:
        device_map = "auto"
    check_model_dir(model_dir)
    if adapter_dir is not None:
        check_adapter_dir(adapter_dir)
        from .checkpoint_checks import check_adapter_fits

        check_adapter_fits(model_dir, adapter_dir)  # headers only: before any weight loads
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The per-tensor loading bar would print once per worker into every captured log.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    tokenizer = AutoTokenizer.from_pretrained(
        str(model_dir), trust_remote_code=False, local_files_only=True
    )
    if getattr(tokenizer, "chat_template", None) is None:
        raise CheckpointError(f"{model_dir}: the tokenizer has no chat template")
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        dtype=torch_dtype,
        attn_implementation=attn_implementation,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
        **({"device_map": device_map} if device_map is not None else {}),
    )
    if adapter_dir is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(
                model, str(adapter_dir), is_trainable=False, local_files_only=True
            )
        except (RuntimeError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(
                f"{adapter_dir}: adapter does not fit the base model {model_dir} ({first})"
            ) from None
        _check_adapter_applied(model, adapter_dir, model_dir)
    if device_map is None:
        model.to(device)
    else:
        # Dispatched over devices: the first layer's device takes the inputs.
        device = str(model.get_input_embeddings().weight.device)
    model.eval()
    stop = _stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
    return LoadedModel(model, tokenizer, stop, int(pad), device, dtype)


def _check_adapter_applied(model: Any, adapter_dir: Path, model_dir: Path) -> None:
    """peft only warns when target modules are missing; a no-op adapter must be an error."""
    import torch

    n_lora = sum(1 for name, _ in model.named_parameters() if "lora_" in name)
    if n_lora == 0:
        raise CheckpointError(
            f"{adapter_dir}: no adapter weights were applied to {model_dir} "
            "(its target modules do not exist in this base model)"
        )
    # Weights that failed to load stay at their init: lora_B zeros everywhere means the file's
    # tensors matched no module of this model.
    bs = [p for name, p in model.named_parameters() if "lora_B" in name]
    if bs and all(bool(torch.count_nonzero(p) == 0) for p in bs):
        raise CheckpointError(
            f"{adapter_dir}: none of the adapter's weights match modules of {model_dir} "
            "(adapter made for another base model?)"
        )
