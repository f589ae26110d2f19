"""The checks ``memeval merge`` makes on a set of shard runs, scenario and episode runs alike.

:mod:`pytest_memeval.tools.merge` (scenario runs) and :mod:`pytest_memeval.tools.episode_merge`
(closed-loop runs) read their shards differently, but check them as a set the same way: each is
a shard run (``scope.shard`` in its metrics), they agree on what must be common (N, each
fingerprint...), they are shards 1..N each given once, no id is in two of them, and the merged
run may be written to ``-o OUT``, under its lock. Each check appends readable lines to a list of
problems; :class:`MergeError` carries them all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.records import RecordError, ShardScope, validate_shard_scope
from pytest_memeval.core.rundir import METRICS, read_json
from pytest_memeval.core.runlock import LockHeld, RunLock

__all__ = [
    "MergeError",
    "ShardLike",
    "ShardNamed",
    "agree",
    "agree_fingerprints",
    "check_numbering",
    "load_all",
    "out_problems",
    "shard_scope_of",
    "write_locked",
]

S = TypeVar("S", bound="ShardLike")
T = TypeVar("T")


class MergeError(Exception):
    """The shard runs cannot be merged; ``problems`` says every reason."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class ShardNamed:
    """The name and number of a shard run, from its ``path`` and ``shard`` (a base of the
    shard run types of both merges)."""

    path: Path
    shard: ShardScope

    @property
    def name(self) -> str:
        return f"shard {self.shard['spec']} ({self.path})"

    @property
    def k(self) -> int:
        return self.shard["index"]


class ShardLike(Protocol):
    """What the set checks read of one shard run (``ShardRun``, ``EpisodeShard``)."""

    @property
    def path(self) -> Path: ...

    @property
    def metrics(self) -> Any: ...

    @property
    def shard(self) -> ShardScope: ...

    @property
    def ids(self) -> list[str]: ...

    @property
    def name(self) -> str: ...

    @property
    def k(self) -> int: ...


def load_all(
    paths: Sequence[Path], load: Callable[[Path, list[str]], S | None], problems: list[str]
) -> list[S]:
    """Each of ``paths`` (resolved) read by ``load``; what is wrong goes to ``problems``."""
    runs = []
    for path in paths:
        run = load(Path(path).resolve(), problems)
        if run is not None:
            runs.append(run)
    if not paths:
        problems.append("no shard run directory given")
    return runs


def shard_scope_of(path: Path, metrics: Any, problems: list[str]) -> ShardScope | None:
    """The checked ``scope.shard`` of the run at ``path``; ``None`` (and a problem) if none."""
    block = (metrics.get("scope") or {}).get("shard")
    if not isinstance(block, dict):
        problems.append(
            f"{path}: not a shard run (its metrics have no scope.shard); merge takes the runs "
            "of pytest --memeval-shard K/N"
        )
        return None
    try:
        return validate_shard_scope(block, str(path / METRICS))
    except RecordError as exc:  # names the file and the field
        problems.append(str(exc))
        return None


def agree(runs: Sequence[S], what: str, value: Callable[[S], object], problems: list[str]) -> None:
    """One problem line when ``value(run)`` differs between runs, naming each run's value."""
    values = [value(r) for r in runs]
    if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
        detail = "; ".join(f"{r.name}: {v}" for r, v in zip(runs, values, strict=True))
        problems.append(f"{what} differs between shards: {detail}")


def _fingerprint(key: str) -> Callable[[ShardLike], object]:
    """A shard run's fingerprint ``key`` (None where it has none)."""

    def value(run: ShardLike) -> object:
        return (run.metrics.get("fingerprints") or {}).get(key)

    return value


def agree_fingerprints(runs: Sequence[ShardLike], problems: list[str]) -> None:
    """One problem line per fingerprint (any run has) that differs between the runs."""
    keys = sorted({k for r in runs for k in (r.metrics.get("fingerprints") or {})})
    for key in keys:
        agree(runs, f"{key} fingerprint", _fingerprint(key), problems)


def check_numbering(runs: Sequence[S], unit: str, problems: list[str]) -> set[str] | None:
    """Check that ``runs`` are shards 1..N of one N, each once, and hold no id (a ``unit``:
    scenario, episode) twice. Returns the ids they hold when all that holds, else ``None``
    (the problems said; a different N was reported by the caller's :func:`agree`)."""
    n = runs[0].shard["count"]
    if any(r.shard["count"] != n for r in runs):
        return None  # numbering is meaningless across different N; already reported
    given = Counter(r.k for r in runs)
    for k, times in sorted(given.items()):
        if times > 1:
            where = ", ".join(str(r.path) for r in runs if r.k == k)
            problems.append(f"shard {k}/{n} given {times} times: {where}")
    absent = [f"{k}/{n}" for k in range(1, n + 1) if k not in given]
    if absent:
        problems.append(f"missing shard(s): {', '.join(absent)} (no run directory given for them)")

    seen: dict[str, S] = {}
    duplicated: list[str] = []
    for r in sorted(runs, key=lambda r: r.k):
        for sid in r.ids:
            first = seen.setdefault(sid, r)
            if first is not r:
                duplicated.append(f"{sid} ({first.path} and {r.path})")
    if duplicated:
        problems.append(
            f"{len(duplicated)} {unit}(s) appear in more than one shard: {shown_ids(duplicated)}"
        )
    return None if absent or duplicated else set(seen)


def out_problems(
    out: Path, runs: Sequence[ShardLike], also: Callable[[Path], list[str]] | None = None
) -> list[str]:
    """Why the merge must not be written to ``out`` (``also``: the caller's own reasons, asked
    unless ``out`` is one of the shards)."""
    if any(out == r.path for r in runs):
        return [f"-o {out}: is one of the shard runs; choose another directory"]
    problems = []
    if (out / METRICS).is_file():
        try:
            previous = read_json(out / METRICS)
        except (OSError, ValueError):
            previous = None
        if not (isinstance(previous, dict) and previous.get("merged_from")):
            problems.append(
                f"-o {out}: already holds a run that is not a merge; refusing to overwrite it"
            )
    return problems + (also(out) if also is not None else [])


def write_locked(out: Path, problems_now: Callable[[], list[str]], write: Callable[[], T]) -> T:
    """``write()`` under ``out``'s run lock if ``problems_now()``, asked under the lock, finds
    nothing; else :class:`MergeError`.

    Locked before ``out`` is checked again: a pytest run that writes it between the check and
    the merge would otherwise be replaced without being looked at.
    """
    try:
        lock = RunLock.acquire(out)
    except LockHeld as exc:
        raise MergeError([f"-o {out}: {exc}"]) from None
    except OSError as exc:
        raise MergeError([f"-o {out}: cannot lock it ({exc.strerror or exc})"]) from None
    try:
        problems = problems_now()
        if not problems:
            return write()
    finally:
        lock.release()  # also removes ``out`` if the lock made it and it is empty
    raise MergeError(problems)
