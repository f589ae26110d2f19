"""Checkpoint profiles: the ``[tool.memeval.ckpt.NAME]`` tables that ``--ckpt NAME`` picks.

A model profile::

    [tool.memeval.ckpt.oracle]
    model = "demo/checkpoint/base"                 # transformers model directory, or a
                                                   # .gguf file (required)
    adapter = "demo/checkpoint/adapters/oracle"    # PEFT adapter directory (optional)
    tokenizer = "tokenizers/smollm2"               # tokenizer directory (optional; default:
                                                   # the model's own, a GGUF file's included)
    benchmark = "data/val.jsonl"                   # a JSONL file, or a builder table:
    # benchmark = { builder = "scene_memory", tasks = "...", init_state_manifest = "..." }
    generation = { max_new_tokens = 16, dtype = "float32", attn_implementation = "eager" }
    parse = { final = "[a-z_]+", turn = "(pick|place|open|close) .+" }   # optional

A replay profile re-scores an existing run's predictions without a model::

    [tool.memeval.ckpt.oracle-replay]
    kind = "replay"
    predictions = "runs/oracle/predictions.jsonl"
    benchmark = ...

Relative paths are resolved against the directory of the file that defines the profile.
Every error names the file, the profile and the key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_memeval.core.matching import ParseRules
from pytest_memeval.env import EnvSpec, EnvSpecError, parse_env_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "BenchmarkSpec",
    "GenerationSettings",
    "Profile",
    "ProfileError",
    "apply_overrides",
    "load_profiles",
    "memeval_table",
    "parse_toml",
    "profile_from_plain",
    "profile_to_plain",
    "read_toml",
    "resolve_profile",
]

_MODEL_KEYS = {
    "kind",
    "model",
    "adapter",
    "tokenizer",
    "benchmark",
    "generation",
    "parse",
    # a closed-loop profile (docs/closed-loop.md): its environment and system text
    "env",
    "system",
}
_REPLAY_KEYS = {"kind", "predictions", "benchmark", "parse"}
_GENERATION_KEYS = {"max_new_tokens", "dtype", "attn_implementation"}
_DTYPES = ("float32", "bfloat16", "float16")


class ProfileError(ValueError):
    """A profile is unknown or malformed; the message names file, profile and key."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where scenarios come from: a JSONL ``path``, or a ``builder`` name and its options."""

    path: Path | None = None
    builder: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.path is not None:
            return str(self.path)
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"builder {self.builder}({opts})"


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings; part of the decoding fingerprint."""

    max_new_tokens: int = 32
    dtype: str = "float32"
    attn_implementation: str = "eager"

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "greedy": True,
        }


@dataclass(frozen=True)
class Profile:
    """One resolved checkpoint profile."""

    name: str
    kind: str
    benchmark: BenchmarkSpec
    source: Path
    model: Path | None = None
    adapter: Path | None = None
    predictions: Path | None = None
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    parse: ParseRules = field(default_factory=ParseRules)
    #: the profile's ``tokenizer`` directory; ``None``: the model's own tokenizer
    tokenizer: Path | None = None
    #: a GGUF ``model``'s safetensors conversion (set at configure, model/gguf.py)
    converted: Path | None = None
    #: a closed-loop profile's environment (its ``env`` table); ``None``: a scenario profile
    env: EnvSpec | None = None
    #: a closed-loop profile's system text (``None``: each episode's task description)
    system: str | None = None

    @property
    def root(self) -> Path:
        return self.source.parent

    @property
    def model_dir(self) -> Path:
        """The transformers directory to load: ``model``, or a GGUF file's conversion."""
        directory = self.converted or self.model
        if directory is None:
            raise ValueError(f"profile {self.name!r} ({self.kind}) has no model")
        return directory

    @property
    def tokenizer_dir(self) -> Path:
        """Where the tokenizer and its chat template load from."""
        return self.tokenizer or self.model_dir


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file (``pyproject.toml``) as a dict; empty if the file is absent.

    The one TOML reader of the package (profiles, guards, ``memeval slurm``), so a broken file
    reads alike everywhere: :class:`ProfileError` naming the file.
    """
    if not path.is_file():
        return {}
    return parse_toml(path.read_text(encoding="utf-8"), path)


def parse_toml(text: str, source: Path) -> dict[str, Any]:
    """TOML text (of ``source``, named in the error) as a dict; :class:`ProfileError` if it
    is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: invalid TOML ({exc})") from None


def memeval_table(path: Path, key: str) -> dict[str, Any]:
    """The ``[tool.memeval.<key>]`` table of a TOML file (empty if the file or table is absent).

    One reader for every ``tool.memeval`` table (profiles, guards), so TOML errors read alike.
    """
    table = read_toml(path).get("tool", {}).get("memeval", {}).get(key, {})
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: [tool.memeval.{key}] must be a table of tables")
    return table


def load_profiles(path: Path) -> dict[str, Mapping[str, Any]]:
    """The raw ``[tool.memeval.ckpt]`` tables of a TOML file (empty if it has none)."""
    return memeval_table(path, "ckpt")


def resolve_profile(name: str, path: Path) -> Profile:
    """Resolve profile ``name`` from ``path``; unknown names list the known ones."""
    profiles = load_profiles(path)
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise ProfileError(
            f"unknown --ckpt {name!r}: no [tool.memeval.ckpt.{name}] in {path} (known: {known})"
        )
    raw = profiles[name]
    where = f"{path}: [tool.memeval.ckpt.{name}]"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be a table")
    kind = raw.get("kind", "model")
    if kind not in ("model", "replay"):
        raise ProfileError(f"{where}: kind must be 'model' or 'replay', got {kind!r}")
    allowed = _MODEL_KEYS if kind == "model" else _REPLAY_KEYS
    unknown = set(raw) - allowed
    if unknown:
        raise ProfileError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})"
        )
    root = path.parent

    def required_path(key: str) -> Path:
        value = raw.get(key)
        if value is None:
            raise ProfileError(f"{where}: missing required key {key!r}")
        if not isinstance(value, str) or not value:
            raise ProfileError(f"{where}: {key!r} must be a path string")
        return (root / value).resolve()

    env, system = _env_keys(raw, where)
    if env is not None and raw.get("benchmark") is None:
        benchmark = BenchmarkSpec()  # a closed-loop profile needs no scenarios
    else:
        benchmark = _benchmark_spec(raw.get("benchmark"), where, root)
    parse = raw.get("parse", {})
    if not isinstance(parse, dict) or set(parse) - {"final", "turn"}:
        raise ProfileError(f"{where}: 'parse' must be a table with keys 'final' and/or 'turn'")
    rules = ParseRules(final=parse.get("final"), turn=parse.get("turn"))
    if kind == "replay":
        return Profile(
            name, kind, benchmark, path, predictions=required_path("predictions"), parse=rules
        )

    def optional_path(key: str) -> Path | None:
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ProfileError(f"{where}: {key!r} must be a path string")
        return (root / value).resolve() if value else None

    return Profile(
        name,
        kind,
        benchmark,
        path,
        model=required_path("model"),
        adapter=optional_path("adapter"),
        generation=_generation(raw.get("generation", {}), where),
        parse=rules,
        tokenizer=optional_path("tokenizer"),
        env=env,
        system=system,
    )


def _env_keys(raw: Mapping[str, Any], where: str) -> tuple[EnvSpec | None, str | None]:
    """A closed-loop profile's ``env`` table and ``system`` text (docs/closed-loop.md)."""
    system = raw.get("system")
    if system is not None and (not isinstance(system, str) or not system.strip()):
        raise ProfileError(f"{where}: 'system' must be a non-empty string")
    if "env" not in raw:
        if system is not None:
            raise ProfileError(f"{where}: 'system' is for a closed-loop profile (with 'env')")
        return None, None
    try:
        return parse_env_spec(raw["env"]), system
    except EnvSpecError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _benchmark_spec(value: Any, where: str, root: Path) -> BenchmarkSpec:
    if value is None:
        raise ProfileError(f"{where}: missing required key 'benchmark'")
    if isinstance(value, str):
        return BenchmarkSpec(path=(root / value).resolve())
    if isinstance(value, dict):
        builder = value.get("builder")
        if not isinstance(builder, str) or not builder:
            raise ProfileError(f"{where}: benchmark table needs a 'builder' name")
        options = {k: v for k, v in value.items() if k != "builder"}
        return BenchmarkSpec(builder=builder, options=options)
    raise ProfileError(f"{where}: 'benchmark' must be a file path or a builder table")


def _generation(value: Any, where: str) -> GenerationSettings:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: 'generation' must be a table")
    unknown = set(value) - _GENERATION_KEYS
    if unknown:
        raise ProfileError(
            f"{where}: unknown generation key(s) {sorted(unknown)} "
            f"(allowed: {sorted(_GENERATION_KEYS)})"
        )
    settings = GenerationSettings(**value)
    if (
        not isinstance(settings.max_new_tokens, int)
        or isinstance(settings.max_new_tokens, bool)
        or settings.max_new_tokens < 1
    ):
        raise ProfileError(f"{where}: generation.max_new_tokens must be a positive integer")
    if settings.dtype not in _DTYPES:
        raise ProfileError(f"{where}: generation.dtype must be float32, bfloat16 or float16")
    if not isinstance(settings.attn_implementation, str) or not settings.attn_implementation:
        raise ProfileError(f"{where}: generation.attn_implementation must be a non-empty string")
    return settings


# -- command-line overrides (sweeps) ---------------------------------------------------------

#: Keys ``--memeval-set`` accepts, and how a command-line string becomes their value.
SET_KEYS: dict[str, str] = {
    "generation.max_new_tokens": "a positive integer",
    "generation.dtype": "float32, bfloat16 or float16",
    "generation.attn_implementation": "eager, sdpa, flash_attention_2, ...",
}


def _set_value(key: str, text: str) -> Any:
    if key == "generation.max_new_tokens":
        try:
            return int(text.strip())
        except ValueError:
            raise ProfileError(
                f"--memeval-set {key}={text}: {text!r} is not a positive integer"
            ) from None
    return text.strip()


def apply_overrides(
    profile: Profile,
    *,
    model: Path | None = None,
    adapter: Path | None = None,
    settings: list[str] | None = None,
) -> tuple[Profile, dict[str, dict[str, str | None]]]:
    """``profile`` with the command line's overrides applied, and what was overridden.

    ``settings`` are ``KEY=VALUE`` strings (``--memeval-set``); only :data:`SET_KEYS` are
    accepted. The second value maps each overridden part (``adapter``, ``model``,
    ``generation.dtype``...) to ``{"value": new, "profile": old}`` (as text, for metrics and
    the summary). Unknown keys and bad values raise :class:`ProfileError` naming them.
    """
    overrides: dict[str, dict[str, str | None]] = {}
    if model is None and adapter is None and not settings:
        return profile, overrides
    if profile.kind != "model":
        given = [
            opt
            for opt, val in (
                ("--memeval-model", model),
                ("--memeval-adapter", adapter),
                ("--memeval-set", settings),
            )
            if val
        ]
        raise ProfileError(
            f"{' and '.join(given)}: --ckpt {profile.name} is a {profile.kind} profile "
            f"({profile.source}); only model profiles can be overridden"
        )
    changes: dict[str, Any] = {}
    if model is not None:
        changes["model"] = model
        changes["converted"] = None  # the profile's own model's conversion is not this one
        overrides["model"] = {"value": str(model), "profile": str(profile.model)}
    if adapter is not None:
        changes["adapter"] = adapter
        old = str(profile.adapter) if profile.adapter is not None else None
        overrides["adapter"] = {"value": str(adapter), "profile": old}
    generation = dict(profile.generation.as_dict())
    generation.pop("greedy", None)
    for item in settings or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ProfileError(
                f"--memeval-set {item!r}: expected KEY=VALUE, e.g. generation.dtype=bfloat16"
            )
        if key not in SET_KEYS:
            allowed = ", ".join(sorted(SET_KEYS))
            raise ProfileError(f"--memeval-set {item!r}: unknown key {key!r} (allowed: {allowed})")
        value = _set_value(key, text)
        leaf = key.split(".", 1)[1]
        overrides[key] = {"value": str(value), "profile": str(generation[leaf])}
        generation[leaf] = value
    try:
        changes["generation"] = _generation(generation, "--memeval-set")
    except ProfileError as exc:
        raise ProfileError(f"{exc} (got {', '.join(settings or [])})") from None
    return replace(profile, **changes), overrides


# -- hand-over to xdist workers (plain data) ---------------------------------------------------


def profile_to_plain(profile: Profile) -> dict[str, Any]:
    """The resolved profile as JSON-able data (what the controller hands each worker)."""

    def path(p: Path | None) -> str | None:
        return str(p) if p is not None else None

    return {
        "name": profile.name,
        "kind": profile.kind,
        "source": str(profile.source),
        "benchmark": {
            "path": path(profile.benchmark.path),
            "builder": profile.benchmark.builder,
            "options": dict(profile.benchmark.options),
        },
        "model": path(profile.model),
        "adapter": path(profile.adapter),
        "tokenizer": path(profile.tokenizer),
        "converted": path(profile.converted),
        "predictions": path(profile.predictions),
        "generation": {
            "max_new_tokens": profile.generation.max_new_tokens,
            "dtype": profile.generation.dtype,
            "attn_implementation": profile.generation.attn_implementation,
        },
        "parse": {"final": profile.parse.final, "turn": profile.parse.turn},
        "env": profile.env.as_plain() if profile.env is not None else None,
        "system": profile.system,
    }


def profile_from_plain(data: Mapping[str, Any]) -> Profile:
    """The inverse of :func:`profile_to_plain` (a worker rebuilds the controller's profile)."""

    def path(value: Any) -> Path | None:
        return Path(value) if value is not None else None

    bench = data["benchmark"]
    return Profile(
        name=str(data["name"]),
        kind=str(data["kind"]),
        benchmark=BenchmarkSpec(
            path=path(bench["path"]), builder=bench["builder"], options=dict(bench["options"])
        ),
        source=Path(data["source"]),
        model=path(data["model"]),
        adapter=path(data["adapter"]),
        predictions=path(data["predictions"]),
        generation=GenerationSettings(**data["generation"]),
        parse=ParseRules(**data["parse"]),
        tokenizer=path(data.get("tokenizer")),
        converted=path(data.get("converted")),
        env=parse_env_spec(data["env"]) if data.get("env") is not None else None,
        system=data.get("system"),
    )


def describe_overrides(overrides: Mapping[str, Mapping[str, str | None]]) -> str:
    """``adapter /x/checkpoint-500 (profile: /y/oracle), generation.dtype bfloat16 (...)``."""
    return ", ".join(
        f"{key} {part.get('value')} (profile: {part.get('profile') or 'none'})"
        for key, part in overrides.items()
    )
