"""Does this adapter fit this base model? Answered from safetensors headers alone.

An adapter trained on another base model either fails deep inside peft with a shape error
or, worse, loads with a warning and silently does nothing. This check runs at configure time
on the controller (and costs milliseconds): it reads the tensor *names and shapes* from the
safetensors headers of the base model and the adapter (no tensor data is read, torch is
not imported) and refuses a mismatch with one message that names the
first mismatching modules.

Rules, for each adapter tensor ``base_model.model.<module>.<part>.weight``:

* LoRA ``lora_A`` (``r x in``) / ``lora_B`` (``out x r``): ``<module>.weight`` must exist in
  the base model with shape ``out x in`` (``in x out`` when ``fan_in_fan_out``, GPT-2's
  Conv1D);
* LoRA ``lora_embedding_A`` (``r x num``) / ``lora_embedding_B`` (``dim x r``): the base
  embedding is ``num x dim``;
* any other tensor (``modules_to_save`` copies, DoRA magnitudes, other PEFT methods): the
  module must exist in the base model; a full copy of a base weight must have its shape.

A module absent from the base file because its weight is tied (``lm_head`` with
``tie_word_embeddings``) is accepted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from pytest_memeval.core.formatting import shown_list
from pytest_memeval.core.profiles import Profile

__all__ = [
    "CheckpointError",
    "adapter_mismatches",
    "check_adapter_dir",
    "check_adapter_fits",
    "check_model_dir",
    "check_profile_checkpoint",
    "check_tokenizer_dir",
    "fingerprint_dir",
    "safetensors_shapes",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class CheckpointError(RuntimeError):
    """A model or adapter directory cannot be loaded safely; the message says which and why."""


def _weights(directory: Path) -> tuple[list[Path], list[Path]]:
    files = [p for p in sorted(directory.iterdir()) if p.is_file()]
    safe = [p for p in files if p.suffix == ".safetensors"]
    pickled = [p for p in files if p.suffix in PICKLE_SUFFIXES]
    return safe, pickled


def _refuse_remote_code(config: Path, what: str) -> None:
    """Refuse a config file (``config.json``, ``tokenizer_config.json``) naming remote code."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{config}: unreadable config ({exc})") from None
    if isinstance(data, dict) and "auto_map" in data:
        raise CheckpointError(
            f"{config}: the {what} needs remote code (auto_map {sorted(data['auto_map'])}); "
            "pytest-memeval never runs checkpoint code (trust_remote_code is off)"
        )


def check_model_dir(path: Path) -> None:
    """Refuse a base-model directory that is missing, pickle-only or needs remote code."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise CheckpointError(
            f"{path} is a GGUF file, not a model directory: name it as a profile's 'model' "
            "(or --memeval-model), which converts it once (pytest_memeval.model.gguf)"
        )
    if not path.is_dir():
        raise CheckpointError(f"model directory not found: {path}")
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"{path}: no config.json (not a transformers model directory)")
    _refuse_remote_code(config, "model")
    safe, pickled = _weights(path)
    if not safe:
        found = ", ".join(p.name for p in pickled) or "none"
        raise CheckpointError(
            f"{path}: no .safetensors weights (found: {found}); pickle checkpoints are refused "
            "and never unpickled. Convert them with safetensors first."
        )


def check_tokenizer_dir(path: Path) -> None:
    """Refuse a ``tokenizer`` directory that is missing, holds no tokenizer or needs remote
    code."""
    if not path.is_dir():
        raise CheckpointError(f"tokenizer directory not found: {path}")
    config = path / "tokenizer_config.json"
    if not config.is_file() and not (path / "tokenizer.json").is_file():
        raise CheckpointError(
            f"{path}: no tokenizer_config.json or tokenizer.json (not a tokenizer directory)"
        )
    if config.is_file():
        _refuse_remote_code(config, "tokenizer")


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


_PREFIX = "base_model.model."
_LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")
#: Problems shown in the one message, the rest counted: fewer than formatting.SHOWN, as each
#: is a sentence (a tensor name and two shapes), not an id.
_SHOWN = 3
#: The safetensors format caps its JSON header at 100 MB.
_MAX_HEADER = 100_000_000


def safetensors_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over ``files``, from their headers only.

    The header is read as the safetensors format defines it (an 8-byte little-endian length,
    then that many bytes of JSON: ``{name: {"dtype", "shape", "data_offsets"}}``) rather than
    through ``safetensors.safe_open``: that needs a framework (numpy or torch) imported, and
    neither survives being imported twice in one process, which pytester's in-process runs
    do. No tensor data is read either way.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            size = file.stat().st_size
            with file.open("rb") as fh:
                length = int.from_bytes(fh.read(8), "little")
                if not 2 <= length <= min(size - 8, _MAX_HEADER):
                    raise ValueError(f"header length {length} out of range")
                header = json.loads(fh.read(length).decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                shape = info["shape"] if isinstance(info, dict) else None
                if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
                    raise ValueError(f"tensor {key!r} has no valid shape")
                shapes[key] = tuple(shape)
        except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{file}: unreadable safetensors header ({exc})") from None
    return shapes


def _base_files(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix == ".safetensors")


def _lookup(base: Mapping[str, tuple[int, ...]], name: str) -> str | None:
    """The base tensor called ``name``, allowing for a head-less/headed prefix difference
    (``model.layers.0...`` saved from the bare model vs ``layers.0...``)."""
    if name in base:
        return name
    for key in base:
        if key.endswith("." + name) or name.endswith("." + key):
            return key
    return None


def _module_exists(base: Mapping[str, tuple[int, ...]], module: str) -> bool:
    return any(
        key.startswith(module + ".") or ("." + module + ".") in key or key == module for key in base
    )


def _tied(module: str, config: Mapping[str, object]) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return leaf in ("lm_head", "embed_out") and bool(config.get("tie_word_embeddings", True))


def adapter_mismatches(
    base: Mapping[str, tuple[int, ...]],
    adapter: Mapping[str, tuple[int, ...]],
    *,
    fan_in_fan_out: bool = False,
    base_config: Mapping[str, object] | None = None,
) -> list[str]:
    """Human-readable reasons the adapter tensors do not fit the base tensors (empty: fits)."""
    config = base_config or {}
    problems: list[str] = []
    lora: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, shape in sorted(adapter.items()):
        path = name[len(_PREFIX) :] if name.startswith(_PREFIX) else name
        parts = path.split(".")
        hit = next((i for i, p in enumerate(parts) if p in _LORA_PARTS), None)
        if hit is not None:
            module = ".".join(parts[:hit])
            lora.setdefault(module, {})[parts[hit]] = shape
            continue
        module = ".".join(parts[:-1])
        full = _lookup(base, path)
        if full is not None:
            if base[full] != shape:
                problems.append(f"{path}: adapter {list(shape)}, base model {list(base[full])}")
        elif not _module_exists(base, module) and not _tied(module, config):
            problems.append(f"{module}: no such module in the base model")
    for module, found in sorted(lora.items()):
        a, b = found.get("lora_A"), found.get("lora_B")
        if a is not None or b is not None:
            # Linear: A is (r, in), B is (out, r); the base weight is (out, in), or (in, out)
            # for Conv1D layers (fan_in_fan_out).
            out_in = (b[0] if b else None, a[1] if a and len(a) > 1 else None)
            want = (out_in[1], out_in[0]) if fan_in_fan_out else out_in
        else:
            # Embedding: A is (r, num_embeddings), B is (dim, r); the base is (num, dim).
            a, b = found.get("lora_embedding_A"), found.get("lora_embedding_B")
            want = (a[1] if a and len(a) > 1 else None, b[0] if b else None)
        full = _lookup(base, module + ".weight")
        if full is None:
            if not _tied(module, config):
                problems.append(f"{module}: no such module in the base model")
            continue
        actual = base[full]
        fits = len(actual) == 2 and all(
            w is None or w == d for w, d in zip(want, actual, strict=True)
        )
        if not fits:
            shown = "x".join("?" if w is None else str(w) for w in want)
            problems.append(
                f"{module}: adapter expects a {shown} weight, base model has "
                f"{'x'.join(str(d) for d in actual)}"
            )
    return problems


def check_adapter_fits(model_dir: Path, adapter_dir: Path) -> None:
    """Raise :class:`CheckpointError` (one message) if the adapter was made for another base.

    Call after :func:`~pytest_memeval.model.checks.check_model_dir` and
    :func:`~pytest_memeval.model.checks.check_adapter_dir` (both directories exist and hold
    safetensors weights).
    """
    adapter_file = adapter_dir / "adapter_model.safetensors"
    try:
        cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
        base_cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"{adapter_dir}: unreadable adapter or model config ({exc})"
        ) from None
    if not isinstance(cfg, dict) or not isinstance(base_cfg, dict):
        raise CheckpointError(f"{adapter_dir}: adapter_config.json must be a JSON object")
    problems = adapter_mismatches(
        safetensors_shapes(_base_files(model_dir)),
        safetensors_shapes([adapter_file]),
        fan_in_fan_out=bool(cfg.get("fan_in_fan_out", False)),
        base_config=base_cfg,
    )
    if not problems:
        return
    made_for = cfg.get("base_model_name_or_path")
    hint = f" (its adapter_config.json names base model {made_for!r})" if made_for else ""
    raise CheckpointError(
        f"{adapter_dir}: adapter does not fit the base model {model_dir}{hint}: "
        + shown_list(problems, _SHOWN, sep="; ")
    )


def check_profile_checkpoint(profile: Profile) -> None:
    """Every check of a model profile's checkpoint before anything loads it: the model
    directory, the tokenizer directory if one is named, the adapter directory and whether
    the adapter fits the model (each raises :class:`CheckpointError`)."""
    check_model_dir(profile.model_dir)
    if profile.tokenizer is not None:
        check_tokenizer_dir(profile.tokenizer)
    if profile.adapter is not None:
        check_adapter_dir(profile.adapter)
        check_adapter_fits(profile.model_dir, profile.adapter)
