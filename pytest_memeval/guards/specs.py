"""The guard tables: which data variants are guarded, and how.

Guarded variants are configured in ``[tool.memeval.guards.NAME]`` tables next to the
checkpoint profiles; :func:`load_guard_specs` reads them into :class:`GuardSpec` records and
refuses a malformed table with a :class:`GuardError` that names the file, the table and the
key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_memeval.core.profiles import ProfileError, memeval_table

__all__ = ["SNAPSHOT_KINDS", "GuardError", "GuardSpec", "load_guard_specs"]

#: What a guard table may snapshot: the built records (and their order), the prompt tokens.
SNAPSHOT_KINDS = ("records", "tokens")
_GUARD_KEYS = {"profile", "reference", "snapshot", "tokenizer", "prefix"}


class GuardError(ValueError):
    """A guard table is malformed or names something that does not exist.

    The message names the file, the table and the key.
    """


@dataclass(frozen=True)
class GuardSpec:
    """One ``[tool.memeval.guards.NAME]`` table: a data variant and the guards it gets."""

    name: str
    profile: str
    source: Path
    reference: Path | None = None
    snapshot: tuple[str, ...] = ()
    tokenizer: Path | None = None
    prefix: bool = True

    @property
    def where(self) -> str:
        return f"{self.source}: [tool.memeval.guards.{self.name}]"

    @property
    def needs_tokenizer(self) -> bool:
        return self.prefix or "tokens" in self.snapshot


def load_guard_specs(path: Path) -> list[GuardSpec]:
    """The guard tables of ``path`` (a pyproject.toml), in file order; ``[]`` without any.

    Each table::

        [tool.memeval.guards.baseline]
        profile = "baseline"                 # a [tool.memeval.ckpt.*] profile (default: NAME)
        reference = "data/baseline/val.jsonl"  # training-format file, compared byte for byte
        snapshot = ["records", "tokens"]     # byte-exact snapshots (default: none)
        tokenizer = "checkpoint/base"        # default: the profile's model directory
        prefix = true                        # per-turn token-prefix property (default: true)

    Paths are relative to the file's directory. Errors name the file, the table and the key.
    """
    try:
        tables = memeval_table(path, "guards")
    except ProfileError as exc:
        raise GuardError(str(exc)) from None
    return [_spec(name, raw, path) for name, raw in tables.items()]


def _spec(name: str, raw: Any, path: Path) -> GuardSpec:
    where = f"{path}: [tool.memeval.guards.{name}]"
    if not isinstance(raw, dict):
        raise GuardError(f'{where} must be a table (e.g. profile = "{name}")')
    unknown = set(raw) - _GUARD_KEYS
    if unknown:
        raise GuardError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_GUARD_KEYS)})"
        )
    root = path.parent

    def optional_path(key: str) -> Path | None:
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise GuardError(f"{where}: {key!r} must be a path string, got {value!r}")
        return (root / value).resolve()

    profile = raw.get("profile", name)
    if not isinstance(profile, str) or not profile:
        raise GuardError(f"{where}: 'profile' must be a profile name, got {profile!r}")
    snapshot = raw.get("snapshot", [])
    if not isinstance(snapshot, list) or not all(s in SNAPSHOT_KINDS for s in snapshot):
        raise GuardError(
            f"{where}: 'snapshot' must be a list drawn from {list(SNAPSHOT_KINDS)}, "
            f"got {snapshot!r}"
        )
    prefix = raw.get("prefix", True)
    if not isinstance(prefix, bool):
        raise GuardError(f"{where}: 'prefix' must be true or false, got {prefix!r}")
    return GuardSpec(
        name=name,
        profile=profile,
        source=path,
        reference=optional_path("reference"),
        snapshot=tuple(dict.fromkeys(snapshot)),
        tokenizer=optional_path("tokenizer"),
        prefix=prefix,
    )
