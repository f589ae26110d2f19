"""Gates per slice: ``--memeval-min-m1 query:door-state=0.8``, ``--memeval-min-m2 TAG=RATE``,
``--memeval-max-drop TAG=PP`` (against ``--memeval-baseline``).

The gate options take a bare value for the whole benchmark (as before) and ``SLICE=VALUE``
for a slice (a tag, a glob of tags, or ``TAG&TAG``: :mod:`pytest_memeval.core.slices`),
repeated as needed. A scenario is in a slice when this run's record, or the baseline's, carries
the tag (the baseline variant of a benchmark cannot know the oracle variant's tags). Slices
are checked against the benchmark's (and the baseline's) tags at start-up, before any model
loads; after the run each slice is checked exactly like the whole benchmark
(:mod:`pytest_memeval.tools.gate.checks`), and the same power warning says when a slice is too
small to resolve the drop it is asked to hold, or when its threshold lies inside its own 95%
interval: the verdict stands as written, but may flap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest

from pytest_memeval.core.formatting import percent
from pytest_memeval.core.records import Record
from pytest_memeval.core.slices import SliceError, SliceSpec, parse_slice
from pytest_memeval.core.stats import mde_paired_binary, min_detectable_drop, wilson_interval
from pytest_memeval.tools.gate.checks import GateCheck, drop_check, pct, threshold_check

__all__ = [
    "Outcome",
    "SliceGates",
    "SliceLimit",
    "evaluate_slice_gates",
    "outcomes",
    "slice_limits",
    "slice_warnings",
    "split_values",
]


@dataclass(frozen=True)
class Outcome:
    """What a slice gate needs of one scenario's record (a few numbers, not the record)."""

    final_ok: bool
    turns_ok: int
    turns_scored: int
    tags: frozenset[str]


def outcomes(records: Iterable[Record]) -> dict[str, Outcome]:
    """Each record's :class:`Outcome`, by scenario id (m2: aligned scenarios' scored turns)."""
    out = {}
    for rec in records:
        marks = [t["match"] for t in rec["turns"] if t["match"] is not None]
        aligned = rec["aligned"] is True
        out[rec["id"]] = Outcome(
            rec["final_match"] is True,
            marks.count(True) if aligned else 0,
            len(marks) if aligned else 0,
            frozenset(rec.get("tags", ())),
        )
    return out


@dataclass(frozen=True)
class SliceLimit:
    """One slice's threshold (a rate) or largest drop (percentage points)."""

    spec: SliceSpec
    value: Fraction
    #: how the user wrote it (for messages)
    written: str


@dataclass(frozen=True)
class SliceGates:
    """The per-slice gates of a session (empty: none)."""

    min_m1: tuple[SliceLimit, ...] = ()
    min_m2: tuple[SliceLimit, ...] = ()
    max_drop: tuple[SliceLimit, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.min_m1 or self.min_m2 or self.max_drop)


def split_values(values: Sequence[str] | None, option: str) -> tuple[str | None, list[str]]:
    """An appending gate option's values: the bare one (the whole benchmark; at most one) and
    the ``SLICE=VALUE`` ones."""
    bare = [v for v in values or () if "=" not in v]
    if len(bare) > 1:
        raise pytest.UsageError(
            f"{option} is given {len(bare)} values for the whole benchmark ({', '.join(bare)}); "
            "give one, and SLICE=VALUE for a slice"
        )
    return (bare[0] if bare else None), [v for v in values or () if "=" in v]


def slice_limits(
    written: Sequence[str],
    known: Sequence[str],
    option: str,
    parse: Callable[[str, str], Fraction],
) -> tuple[SliceLimit, ...]:
    """The ``SLICE=VALUE`` values of ``option`` against the ``known`` tags; a usage error
    names the value and the tags there are. A glob gates every tag it matches."""
    limits: list[SliceLimit] = []
    for text in written:
        expression, _, raw = text.rpartition("=")
        try:
            specs = parse_slice(expression, known)
        except SliceError as exc:
            raise pytest.UsageError(f"{option} {text!r}: {exc}") from None
        value = parse(raw, f"{option} {expression}")
        limits += [SliceLimit(spec, value, text) for spec in specs]
    return tuple(limits)


def _members(
    spec: SliceSpec, run: Mapping[str, Outcome], base: Mapping[str, Outcome] | None
) -> list[str]:
    """The scenarios of the slice: tagged by this run's record or the baseline's."""
    out = []
    for sid, outcome in run.items():
        tags = outcome.tags | (base[sid].tags if base is not None and sid in base else frozenset())
        if spec.holds(tags):
            out.append(sid)
    return out


def _m1(ids: Sequence[str], side: Mapping[str, Outcome]) -> tuple[int, int]:
    return sum(side[sid].final_ok for sid in ids), len(ids)


def _m2(ids: Sequence[str], side: Mapping[str, Outcome]) -> tuple[int, int]:
    return sum(side[sid].turns_ok for sid in ids), sum(side[sid].turns_scored for sid in ids)


def evaluate_slice_gates(
    gates: SliceGates,
    run: Mapping[str, Outcome],
    base: Mapping[str, Outcome] | None = None,
    base_path: Path | None = None,
) -> list[GateCheck]:
    """Each per-slice gate checked on this run (``run``: its scenarios' outcomes) and, for a
    drop, the baseline's (``base``, read from ``base_path``). A slice without a scenario
    fails: nothing was measured there."""
    checks: list[GateCheck] = []
    for metric, limits, count in (("m1", gates.min_m1, _m1), ("m2", gates.min_m2, _m2)):
        for limit in limits:
            name = f"{metric}[{limit.spec.name}]"
            correct, total = count(_members(limit.spec, run, base), run)
            checks.append(threshold_check(name, correct, total, limit.value))
    for limit in gates.max_drop:
        if base is None or base_path is None:
            raise ValueError("a per-slice max drop needs the baseline's outcomes")
        ids = _members(limit.spec, run, base)
        checks.append(
            drop_check(
                f"m1[{limit.spec.name}]", _m1(ids, run), _m1(ids, base), base_path, limit.value
            )
        )
        ours, theirs = _m2(ids, run), _m2(ids, base)
        if ours[1] and theirs[1]:
            checks.append(
                drop_check(f"m2[{limit.spec.name}]", ours, theirs, base_path, limit.value)
            )
    return checks


def slice_warnings(
    gates: SliceGates,
    run_tags: Mapping[str, frozenset[str]],
    base: Mapping[str, Outcome] | None,
    run: Mapping[str, Outcome] | None = None,
) -> list[str]:
    """Why a per-slice verdict may not mean much; the gates apply as written either way.

    Before the run (``run_tags``: each scenario's tags in this run's benchmark): a max drop
    below the best case Connor's formula allows for the slice's size (as for the whole
    benchmark). After it (``run``: this run's outcomes): the same at the slice's observed
    share of changed scenarios, and a threshold that lies inside the slice's 95% Wilson
    interval of m1 (a few scenarios flipping by chance move the verdict).
    """
    # Tags only, before the run: who is in a slice.
    tags_now = {sid: Outcome(False, 0, 0, tags) for sid, tags in run_tags.items()}
    out: list[str] = []
    for limit in gates.max_drop:
        if base is None:
            break
        n = len(_members(limit.spec, tags_now, base))
        best = min_detectable_drop(n) if n else None
        best_pp = 100.0 if best is None else best * 100
        if limit.value < best_pp:
            out.append(
                f"--memeval-max-drop {limit.written}: {float(limit.value):g} pp is smaller than "
                f"what the slice's {n} scenarios can resolve: at 80% power and alpha 0.05, no "
                f"m1 drop under {best_pp:.1f} pp can be told from chance even if every changed "
                "scenario got worse. The gate applies as written, but it may flap"
            )
        if run is not None:
            ids = _members(limit.spec, run, base)
            changed = sum(1 for sid in ids if run[sid].final_ok != base[sid].final_ok)
            mde = mde_paired_binary(len(ids), changed / len(ids)) if changed else None
            if mde is not None and limit.value < mde * 100:
                out.append(
                    f"slice {limit.spec.name} against the baseline: {changed} of {len(ids)} "
                    f"scenarios changed their m1 outcome; at that rate differences under "
                    f"{mde * 100:.1f} pp are not detectable (80% power, alpha 0.05), so a limit "
                    f"of {float(limit.value):g} pp is below the noise of this comparison"
                )
    if run is not None:
        out += _threshold_noise(gates.min_m1, run, base)
    return out


def _threshold_noise(
    limits: Sequence[SliceLimit], run: Mapping[str, Outcome], base: Mapping[str, Outcome] | None
) -> list[str]:
    """A warning for each m1 threshold inside its slice's 95% Wilson interval."""
    out = []
    for limit in limits:
        correct, total = _m1(_members(limit.spec, run, base), run)
        if not total:
            continue
        low, high = wilson_interval(correct, total)
        if low <= limit.value <= high:
            out.append(
                f"m1[{limit.spec.name}] = {percent(correct / total)} ({correct}/{total}) has "
                f"the threshold {pct(limit.value)} inside its 95% interval [{percent(low)}, "
                f"{percent(high)}]: with {total} scenarios the verdict rests on a few of them "
                "and may flip from run to run"
            )
    return out
