"""A profile's ``env`` table: which environment, which game, which seeds, which limits.

::

    env = { backend = "textworld_express", game = "twc",
            params = "numLocations=1,numItemsToPutAway=2", fold = "test",
            seeds = "0-99", max_steps = 40 }

``params`` is the backend's game parameters, as a ``"k=v,k=v"`` string or a TOML table;
``seeds`` is a seed expression (``"0-99"``, ``"1,3,5-7"``), one integer or a list of them.
Every error names the key (``env.seeds: ...``); the caller adds file and profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_memeval.env.protocol import EnvSpecError

__all__ = [
    "DEFAULT_MAX_STEPS",
    "DEFAULT_STEP_TIMEOUT_S",
    "MAX_SEEDS",
    "EnvSpec",
    "ParamValue",
    "parse_env_spec",
    "parse_params",
    "parse_seeds",
]

#: a game parameter's value: TOML scalars only
ParamValue = str | int | float | bool

#: actions an episode may take when the table does not say (AgentBench's ALFWorld uses 50)
DEFAULT_MAX_STEPS = 50
#: seconds one ``reset`` or ``step`` may take before the environment counts as hung
DEFAULT_STEP_TIMEOUT_S = 60.0
#: more seeds than this in one table is a typo (``"0-99999999"``), not an evaluation
MAX_SEEDS = 100_000

_KEYS = (
    "backend",
    "game",
    "params",
    "fold",
    "seeds",
    "max_steps",
    "invalid_action_limit",
    "step_timeout_s",
)
_REQUIRED = ("backend", "game", "seeds")


@dataclass(frozen=True)
class EnvSpec:
    """One resolved ``env`` table (hashable, plain data; part of a run's fingerprint)."""

    backend: str
    game: str
    seeds: tuple[int, ...]
    #: the game's parameters, sorted by name
    params: tuple[tuple[str, ParamValue], ...] = ()
    #: the backend's data split (TextWorld Express: train, dev or test); ``None``: its default
    fold: str | None = None
    max_steps: int = DEFAULT_MAX_STEPS
    #: consecutive invalid actions that end an episode; ``None``: no limit
    invalid_action_limit: int | None = None
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S

    @property
    def params_text(self) -> str:
        """The parameters as ``"k=v,k=v"`` (sorted; booleans as 0/1, as TextWorld Express)."""
        return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in self.params)

    def as_plain(self) -> dict[str, Any]:
        """The spec as JSON-able data (for fingerprints and records)."""
        return {
            "backend": self.backend,
            "game": self.game,
            "params": dict(self.params),
            "fold": self.fold,
            "seeds": list(self.seeds),
            "max_steps": self.max_steps,
            "invalid_action_limit": self.invalid_action_limit,
            "step_timeout_s": self.step_timeout_s,
        }


def parse_env_spec(table: object, where: str = "env") -> EnvSpec:
    """Check and resolve an ``env`` table; :class:`EnvSpecError` names ``where.<key>``."""
    if not isinstance(table, Mapping):
        raise EnvSpecError(f"{where}: must be a table, got {type(table).__name__}")
    unknown = sorted(str(k) for k in table if k not in _KEYS)
    if unknown:
        raise EnvSpecError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})"
        )
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise EnvSpecError(f"{where}: missing required key(s) {', '.join(missing)}")
    fold = table.get("fold")
    return EnvSpec(
        backend=_name(table["backend"], f"{where}.backend"),
        game=_name(table["game"], f"{where}.game"),
        seeds=parse_seeds(table["seeds"], f"{where}.seeds"),
        params=parse_params(table.get("params", ""), f"{where}.params"),
        fold=None if fold is None else _name(fold, f"{where}.fold"),
        max_steps=_positive_int(table.get("max_steps", DEFAULT_MAX_STEPS), f"{where}.max_steps"),
        invalid_action_limit=_optional_limit(table.get("invalid_action_limit"), where),
        step_timeout_s=_timeout(table.get("step_timeout_s", DEFAULT_STEP_TIMEOUT_S), where),
    )


def parse_seeds(value: object, where: str = "seeds") -> tuple[int, ...]:
    """Seeds from ``"0-99"`` / ``"1,3,5-7"`` (inclusive ranges), an int or a list of ints.

    Order is kept as written; a duplicate, a negative seed, a reversed range or more than
    :data:`MAX_SEEDS` seeds is an error naming ``where``.
    """
    if isinstance(value, bool):
        raise EnvSpecError(f"{where}: expected seeds, got a boolean")
    if isinstance(value, int):
        parts: list[int] = [value]
    elif isinstance(value, str):
        parts = _seed_expression(value, where)
    elif isinstance(value, list):
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
            raise EnvSpecError(f"{where}: a list of seeds must hold integers only")
        parts = list(value)
    else:
        raise EnvSpecError(
            f'{where}: expected "0-99", "1,3,5-7", an integer or a list of integers, '
            f"got {type(value).__name__}"
        )
    if not parts:
        raise EnvSpecError(f"{where}: no seeds")
    negative = [s for s in parts if s < 0]
    if negative:
        raise EnvSpecError(f"{where}: seeds must be 0 or more, got {negative[0]}")
    seen: set[int] = set()
    for seed in parts:
        if seed in seen:
            raise EnvSpecError(f"{where}: seed {seed} appears twice")
        seen.add(seed)
    return tuple(parts)


def _seed_expression(text: str, where: str) -> list[int]:
    seeds: list[int] = []
    for raw in text.split(","):
        piece = raw.strip()
        low, dash, high = piece.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise EnvSpecError(
                f'{where}: {piece!r} is not a seed or a range like "0-99" (in {text!r})'
            ) from None
        if last < first:
            raise EnvSpecError(f"{where}: the range {piece!r} runs backwards")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise EnvSpecError(f"{where}: more than {MAX_SEEDS} seeds in {text!r}")
        seeds.extend(range(first, last + 1))
    return seeds


def parse_params(value: object, where: str = "params") -> tuple[tuple[str, ParamValue], ...]:
    """Game parameters from ``"k=v,k=v"`` (integers read as integers) or a table of scalars."""
    if isinstance(value, str):
        pairs: list[tuple[str, ParamValue]] = []
        for raw in value.split(",") if value.strip() else []:
            key, eq, text = (p.strip() for p in raw.partition("="))
            if not eq or not key:
                raise EnvSpecError(f"{where}: {raw.strip()!r} is not key=value (in {value!r})")
            pairs.append((key, _scalar_text(text)))
    elif isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not isinstance(item, (str, int, float, bool)):
                raise EnvSpecError(
                    f"{where}.{key}: a parameter must be a string, number or boolean"
                )
            pairs.append((str(key), item))
    else:
        raise EnvSpecError(f'{where}: expected "k=v,k=v" or a table, got {type(value).__name__}')
    names = [k for k, _ in pairs]
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise EnvSpecError(f"{where}: {', '.join(twice)} given twice")
    return tuple(sorted(pairs))


def _scalar_text(text: str) -> ParamValue:
    try:
        return int(text)
    except ValueError:
        return text


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EnvSpecError(f"{where}: must be a non-empty string, got {value!r}")
    return value.strip()


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EnvSpecError(f"{where}: must be a positive integer, got {value!r}")
    return value


def _optional_limit(value: object, where: str) -> int | None:
    return None if value is None else _positive_int(value, f"{where}.invalid_action_limit")


def _timeout(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EnvSpecError(f"{where}.step_timeout_s: must be a positive number, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise EnvSpecError(f"{where}.step_timeout_s: must be a positive number, got {value!r}")
    return seconds
