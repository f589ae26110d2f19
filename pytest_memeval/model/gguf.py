"""GGUF checkpoints: a ``.gguf`` file as a profile's ``model``, dequantized once.

transformers reads GGUF files (``from_pretrained(dir, gguf_file=NAME)``, with the ``gguf``
package) and dequantizes them into a normal torch model: minutes and tens of GB for a 7B
file. Doing that in every xdist worker of every run would multiply both, so the controller
converts the file once into a plain safetensors checkpoint directory in the cache
(:mod:`pytest_memeval.core.cache`)::

    <cache>/gguf/<sha256 of the file>/
        config.json  generation_config.json  model.safetensors (float32, the dequantized
        weights exactly)  tokenizer.json  tokenizer_config.json  chat_template.jinja
        memeval-gguf.json (where it came from: file, size, sha256, versions, seconds)

and every worker (and every later run) loads that directory with the ordinary safetensors
loader. Keyed by the file's hash, the conversion is found again whatever the file is called
or wherever it lies; :func:`pytest_memeval.core.cache.produce_once` makes concurrent
workers and runs wait for one conversion instead of repeating it, and never lets them see a
half-written one.

The model's fingerprint is the GGUF file's own ``sha256:<hex>`` (what ``sha256sum`` prints).
GGUF holds no pickle (the ``gguf`` reader maps raw tensors), ``trust_remote_code`` stays off,
and the converted directory passes the same checks as any other (``checks.check_model_dir``).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from pytest_memeval.compat import installed_version
from pytest_memeval.core.cache import cache_entry, produce_once
from pytest_memeval.core.profiles import Profile
from pytest_memeval.core.rundir import sha256_file
from pytest_memeval.model.checks import CheckpointError

__all__ = [
    "GGUF_EXTRA",
    "PROVENANCE",
    "GgufConversion",
    "GgufHeader",
    "convert_gguf",
    "is_gguf",
    "prepare_profile",
    "read_gguf_header",
]

#: What to install for GGUF support (pyproject's ``gguf`` extra).
GGUF_EXTRA = "pytest-memeval[gguf]"
#: The file in a conversion that says where it came from.
PROVENANCE = "memeval-gguf.json"
#: ``gguf`` releases transformers accepts (transformers' own ``is_gguf_available`` check).
_GGUF_MIN = "0.10.0"


def is_gguf(path: Path | None) -> bool:
    """Whether a profile's ``model`` names a GGUF file (by its ``.gguf`` suffix)."""
    return path is not None and path.suffix.lower() == ".gguf" and not path.is_dir()


@dataclass(frozen=True)
class GgufConversion:
    """A GGUF file and its safetensors conversion in the cache."""

    source: Path
    #: ``sha256:<hex>`` of the file: the model fingerprint, and the cache key
    fingerprint: str
    directory: Path
    #: seconds this process spent converting; ``None`` when the conversion was there already
    seconds: float | None

    def describe(self) -> str:
        how = (
            f"converted to safetensors in {self.seconds:.1f} s"
            if self.seconds is not None
            else "safetensors conversion from the cache"
        )
        return f"GGUF {self.fingerprint[:19]}..., {how}: {self.directory}"


def _require_gguf_package(path: Path) -> None:
    try:
        # Deferred: an optional dependency (the gguf extra), needed only to convert.
        import gguf  # noqa: F401
    except ImportError:
        raise CheckpointError(
            f"{path}: reading a GGUF checkpoint needs the 'gguf' package, which is not "
            f"installed: pip install '{GGUF_EXTRA}'"
        ) from None
    found = installed_version("gguf")
    if found != "unknown" and Version(found) < Version(_GGUF_MIN):
        raise CheckpointError(
            f"{path}: reading a GGUF checkpoint needs gguf>={_GGUF_MIN} (installed: {found}): "
            f"pip install -U '{GGUF_EXTRA}'"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """transformers' own load of a GGUF file: ``(model, tokenizer)``, float32, dequantized."""
    _require_gguf_package(path)
    # Deferred: torch and transformers take seconds to import; only a conversion needs them.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    where = {"gguf_file": path.name, "trust_remote_code": False, "local_files_only": True}
    try:
        # transformers draws its own tqdm bar for the dequantization (not the one
        # disable_progress_bar turns off); the caller's one line says what is happening.
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **where)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), dtype=torch.float32, **where
            )
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        # transformers says "GGUF model with architecture X is not supported yet", names a
        # tensor it cannot map, or the gguf reader a file it cannot parse.
        raise CheckpointError(
            f"{path}: transformers {transformers.__version__} cannot load this GGUF file "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    return model, tokenizer


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's metadata says, read without its tensors."""

    #: the tokenizer (with its chat template) transformers builds from the metadata
    tokenizer: Any
    #: ``max_position_embeddings`` of the config transformers builds, ``None`` if unset
    positions: int | None


def read_gguf_header(path: Path) -> GgufHeader:
    """The tokenizer and the context length of a GGUF file, from its metadata alone (no
    tensor is read or dequantized: ``memeval init`` checks a file this way)."""
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    _require_gguf_package(path)
    # Deferred: transformers takes seconds to import.
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    where = {"gguf_file": path.name, "trust_remote_code": False, "local_files_only": True}
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **where)
            config = AutoConfig.from_pretrained(str(path.parent), **where)
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise CheckpointError(
            f"{path}: transformers {transformers.__version__} cannot read this GGUF file's "
            f"metadata ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    positions = getattr(config, "max_position_embeddings", None)
    return GgufHeader(tokenizer, positions if isinstance(positions, int) else None)


def _plain_copy(gguf_model: Any) -> Any:
    """The same model as a plain (serialisable) one sharing its tensors.

    A GGUF-loaded model refuses ``save_pretrained`` (its config names the gguf
    quantization): the same architecture built without ``quantization_config``, on the meta
    device (no memory, no random init), takes over the dequantized tensors themselves.
    """
    import torch  # deferred: as in _load_gguf
    from transformers import AutoModelForCausalLM

    plain_config = gguf_model.config.to_dict()
    plain_config.pop("quantization_config", None)
    config = type(gguf_model.config).from_dict(plain_config)
    with torch.device("meta"):
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32
        )
    model.load_state_dict(gguf_model.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = gguf_model.generation_config
    return model.eval()


def _write_conversion(path: Path, fingerprint: str, out: Path) -> None:
    """Dequantize ``path`` with transformers and write it to ``out`` as a plain checkpoint."""
    started = time.perf_counter()
    gguf_model, tokenizer = _load_gguf(path)
    out.mkdir()
    _plain_copy(gguf_model).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    provenance = {
        "source": str(path),
        "size": path.stat().st_size,
        "sha256": fingerprint.split(":", 1)[1],
        "transformers": installed_version("transformers"),
        "gguf": installed_version("gguf"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", "utf-8")


def convert_gguf(
    path: Path, cache_root: Path, notify: Callable[[str], None] | None = None
) -> GgufConversion:
    """The safetensors conversion of GGUF file ``path`` under ``cache_root``, made if absent.

    ``notify`` gets one line when a conversion starts here, or when this process waits for
    another one's. Raises :class:`CheckpointError` (one message naming the file) for a
    missing file, a missing ``gguf`` package, or a file transformers cannot read.
    """
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    fingerprint = sha256_file(path)
    target = cache_entry(cache_root, "gguf", fingerprint.split(":", 1)[1])
    say = notify or (lambda line: None)

    def build(tmp: Path) -> None:
        size = path.stat().st_size / 2**20
        say(f"memeval: converting {path} ({size:.0f} MiB) to safetensors, once: {target}")
        _write_conversion(path, fingerprint, tmp)

    def wait() -> None:
        say(f"memeval: waiting for another process converting {path} into {target}")

    started = time.perf_counter()
    try:
        made = produce_once(target, build, on_wait=wait)
    except OSError as exc:
        raise CheckpointError(
            f"{path}: could not write its safetensors conversion under {target.parent} "
            f"({type(exc).__name__}: {_first_line(exc)}); set --memeval-cache-dir (ini "
            "memeval_cache_dir, env MEMEVAL_CACHE_DIR) to a writable directory"
        ) from None
    return GgufConversion(
        path, fingerprint, target, time.perf_counter() - started if made else None
    )


def prepare_profile(
    profile: Profile, cache_root: Path, notify: Callable[[str], None] | None = None
) -> tuple[Profile, GgufConversion | None]:
    """``profile`` ready to load: a GGUF ``model`` converted (once) and named as
    ``profile.converted``; any other profile is returned as it is, with ``None``."""
    if profile.kind != "model" or not is_gguf(profile.model):
        return profile, None
    assert profile.model is not None
    conversion = convert_gguf(profile.model, cache_root, notify)
    return replace(profile, converted=conversion.directory), conversion
