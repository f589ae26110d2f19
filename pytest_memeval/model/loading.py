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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_memeval.core.noise import third_party_noise_filtered
from pytest_memeval.core.profiles import Profile
from pytest_memeval.model.checks import (
    CheckpointError,
    check_adapter_dir,
    check_adapter_fits,
    check_model_dir,
    check_tokenizer_dir,
)

__all__ = ["LoadedModel", "load_model"]


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
    tokenizer_dir: Path | None = None,
    dtype: str = "float32",
    attn_implementation: str = "eager",
    device: str = "cpu",
    device_map: str | dict[str, Any] | None = None,
) -> LoadedModel:
    """Load base model, tokenizer and adapter for evaluation (eval mode, no gradients).

    ``device_map`` (or ``device="auto"``, which means ``device_map="auto"``) spreads the model
    over several devices as accelerate does (a model larger than one GPU; the worker of
    ``--memeval-gpus-per-worker K`` sees exactly its K GPUs); inputs then go to the device of
    the input embeddings. The tokenizer and its chat template load from ``tokenizer_dir``
    (a profile's ``tokenizer`` key), else from ``model_dir``.
    """
    if device == "auto" and device_map is None:
        device_map = "auto"
    check_model_dir(model_dir)
    if tokenizer_dir is not None:
        check_tokenizer_dir(tokenizer_dir)
    if adapter_dir is not None:
        check_adapter_dir(adapter_dir)
        check_adapter_fits(model_dir, adapter_dir)  # headers only: before any weight loads
    # Deferred: torch and transformers take seconds to import; only loading a model needs them.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The per-tensor loading bar would print once per worker into every captured log.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    tokenizer_source = tokenizer_dir or model_dir
    tokenizer = AutoTokenizer.from_pretrained(
        str(tokenizer_source), trust_remote_code=False, local_files_only=True
    )
    if getattr(tokenizer, "chat_template", None) is None:
        raise CheckpointError(f"{tokenizer_source}: the tokenizer has no chat template")
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
        from peft import PeftModel  # deferred: heavy, and only an adapter needs it

        try:
            # peft trips a transformers deprecation warning the user cannot act on (core/noise.py).
            with third_party_noise_filtered():
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


def load_profile_model(profile: Profile, device: str) -> LoadedModel:
    """A profile's checkpoint as its generation settings ask (dtype, attention), on ``device``:
    the one place the scenario decoders and the closed-loop policy load it from."""
    settings = profile.generation
    return load_model(
        profile.model_dir,
        profile.adapter,
        tokenizer_dir=profile.tokenizer,
        dtype=settings.dtype,
        attn_implementation=settings.attn_implementation,
        device=device,
    )


def _check_adapter_applied(model: Any, adapter_dir: Path, model_dir: Path) -> None:
    """peft only warns when target modules are missing; a no-op adapter must be an error."""
    import torch  # deferred: seconds to import; called only after a model loaded

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
