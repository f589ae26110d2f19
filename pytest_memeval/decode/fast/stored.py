"""Calibrations kept in the cache directory: measured once per model and setting, then reused.

A calibration (``calibration.py``) costs a dozen reference calls. What it measures depends
only on the weights (the model, adapter and tokenizer fingerprints the run computes) and on
the setting it was measured under (``calibration.measurement_setting``: dtype, device kind
and name, threads, attention implementations, batch settings, library versions). So it is
stored as one JSON document under ``<cache>/calibration/<sha256 of its key>.json``, the key
being all of those plus this store's :data:`STORE_FORMAT` and the pytest-memeval version: a
change to any of them is another key, hence another entry (the old one is never read again).

Written with :func:`~pytest_memeval.core.cache.produce_once`: the measuring process holds the
entry's lock, so another process asking for the same key (an xdist worker of the same run, a
concurrent run) waits for it and reads its result instead of measuring too. An entry that
cannot be read or is not what was asked for is measured again and replaced, with a
:class:`CalibrationCacheWarning`; a cache directory that cannot be written costs the reuse
(the calibration is measured and used, not stored), with the same warning. Never a crash,
never a calibration of another key.

The document (:class:`StoredCalibration`) is versioned (``format``) and has room for more:
``sections`` holds further results measured with the calibration, by name (another stage's
probe, e.g. whether an exact mode is available), which this module stores and returns as
they are. A stage that adds a section bumps :data:`STORE_FORMAT`, so entries without it are
not reused.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pytest_memeval.compat import installed_version
from pytest_memeval.core.cache import cache_entry, produce_once
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.decode.fast.bounds import Calibration, Setting

__all__ = [
    "STORE_FORMAT",
    "CalibrationCacheWarning",
    "CalibrationOutcome",
    "CalibrationStore",
    "Measurement",
    "Source",
    "StoredCalibration",
    "weight_fingerprints",
]

#: The stored document's format; part of the key. Bump it when what is measured or how it
#: is stored changes (a new section, a new kind of decision): older entries are then not
#: reused.
STORE_FORMAT = 6  # 2: exact mode; 3: the packed pass in one row; 4: per-row output rows;
# 5: the row_step kind (exact steps from the forward pass's cache); 6: 16-bit forward passes
# on the CPU one scenario each (rules.FORWARD_ALONE_DTYPES)

#: How the calibration a decoder uses came about: measured by this process, or reused
#: from the cache directory (measured by an earlier run or another worker).
Source: TypeAlias = Literal["measured", "reused"]

_KIND = "calibration"


class CalibrationCacheWarning(UserWarning):
    """A stored calibration could not be read (it was measured again) or stored (it was
    measured and used, and the next run measures it again)."""


@dataclass(frozen=True)
class Measurement:
    """What one measurement produced: the calibration, and any further sections measured
    with it (name -> JSON object), stored along."""

    calibration: Calibration
    sections: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredCalibration:
    """One entry of the store: its key, the measurement, and when, how long and by which
    run it was measured. :meth:`to_dict` / :meth:`from_dict`: JSON round trip."""

    key: Mapping[str, object]
    measurement: Measurement
    #: seconds the measurement took
    seconds: float
    #: the run that measured it (``CalibrationStore.run``)
    run: str
    #: ISO 8601 UTC time of the measurement
    created: str

    @property
    def calibration(self) -> Calibration:
        return self.measurement.calibration

    def to_dict(self) -> dict[str, object]:
        return {
            "format": STORE_FORMAT,
            "key": dict(self.key),
            "calibration": self.calibration.to_dict(),
            "sections": {name: dict(value) for name, value in self.measurement.sections.items()},
            "seconds": self.seconds,
            "run": self.run,
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, data: object) -> StoredCalibration:
        """The entry :meth:`to_dict` wrote; ``ValueError`` naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("format") != STORE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {STORE_FORMAT}")
        key, calibration, sections = data.get("key"), data.get("calibration"), data.get("sections")
        seconds, run, created = data.get("seconds"), data.get("run"), data.get("created")
        if not isinstance(key, dict) or not isinstance(calibration, dict):
            raise ValueError("'key' and 'calibration' must be objects")
        if not isinstance(sections, dict) or not all(
            isinstance(v, dict) for v in sections.values()
        ):
            raise ValueError("'sections' must map names to objects")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise ValueError("'seconds' must be a number")
        if not isinstance(run, str) or not isinstance(created, str):
            raise ValueError("'run' and 'created' must be strings")
        measurement = Measurement(Calibration.from_dict(calibration), dict(sections))
        return cls(dict(key), measurement, float(seconds), run, created)


@dataclass(frozen=True)
class CalibrationOutcome:
    """How a decoder got its calibration: :attr:`source`, the seconds this process spent
    measuring (0 when reused), the entry (``None``: not stored) and what it holds."""

    source: Source
    seconds: float
    entry: Path | None
    stored: StoredCalibration


def weight_fingerprints(fingerprints: Mapping[str, Any]) -> dict[str, str | None]:
    """Of a run's fingerprints, those of the weights a calibration depends on (model,
    adapter, tokenizer): what a :class:`CalibrationStore` is keyed by."""
    return {k: v for k, v in fingerprints.items() if k in ("model", "adapter", "tokenizer")}


@dataclass(frozen=True)
class CalibrationStore:
    """The calibrations of one model (``fingerprints``: model, adapter, tokenizer, as the
    run computed them) under the cache directory ``root``.

    ``run`` names the run asking (stored with what it measures); ``fresh``: reuse only
    what this same run measured (``--memeval-recalibrate``: the first process of the run
    measures again, its other workers reuse that).
    """

    root: Path
    fingerprints: Mapping[str, str | None]
    run: str = ""
    fresh: bool = False

    def key(self, setting: Setting) -> dict[str, object]:
        """Everything a stored calibration is valid for."""
        return {
            "format": STORE_FORMAT,
            "pytest_memeval": installed_version("pytest-memeval"),
            "fingerprints": dict(sorted(self.fingerprints.items())),
            "setting": dict(sorted(setting.items())),
        }

    def entry(self, setting: Setting) -> Path:
        """Where the calibration of ``setting`` is stored."""
        blob = json.dumps(self.key(setting), sort_keys=True).encode("utf-8")
        return cache_entry(self.root, _KIND, hashlib.sha256(blob).hexdigest() + ".json")

    def obtain(self, setting: Setting, measure: Callable[[], Measurement]) -> CalibrationOutcome:
        """The stored calibration of ``setting``, or ``measure()``'d now and stored."""
        entry, key = self.entry(setting), self.key(setting)
        found: list[StoredCalibration] = []
        problems: list[str] = []
        made: list[CalibrationOutcome] = []

        def accept(path: Path) -> bool:
            try:
                stored = StoredCalibration.from_dict(json.loads(path.read_text("utf-8")))
            except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeError included
                problems.append(f"{type(exc).__name__}: {exc}")
                return False
            if stored.key != key or dict(stored.calibration.setting) != dict(setting):
                problems.append("it holds the calibration of another key")
                return False
            if self.fresh and stored.run != self.run:
                return False  # --memeval-recalibrate: measured before this run
            found[:] = [stored]
            return True

        def build(tmp: Path) -> None:
            outcome = _measure(key, self.run, measure, entry)
            tmp.write_text(json.dumps(outcome.stored.to_dict(), indent=1), "utf-8")
            made.append(outcome)

        try:
            produce_once(entry, build, accept=accept)
        except OSError as exc:
            _warn(
                f"the calibration cannot be stored at {entry} ({exc}); measured and used, "
                "not stored: the next run measures it again"
            )
            return made[0] if made else _replace_entry(_measure(key, self.run, measure, entry))
        if made:
            if problems:
                _warn(
                    f"the stored calibration {entry} could not be used ({problems[0]}); "
                    "measured again and replaced"
                )
            return made[0]
        if found or accept(entry):
            return CalibrationOutcome("reused", 0.0, entry, found[0])
        # Unreadable although another process just wrote it: measure, do not store.
        _warn(
            f"the stored calibration {entry} could not be used ({problems[-1]}); measured "
            "again, not stored"
        )
        return _replace_entry(_measure(key, self.run, measure, entry))

    def lookup(self, setting: Setting) -> StoredCalibration | None:
        """The stored calibration of ``setting`` if there is one this store may reuse,
        else ``None`` (no entry, one that cannot be read, or, with ``fresh``, one measured
        by another run): for a caller that measures as it goes and stores it with :meth:`save`
        (the closed loop's policy, ``episodes.py``); never waits on a lock."""
        try:
            data = json.loads(self.entry(setting).read_text("utf-8"))
            stored = StoredCalibration.from_dict(data)
        except (OSError, ValueError):  # absent, unreadable or not an entry: measured again
            return None
        if stored.key != self.key(setting) or dict(stored.calibration.setting) != dict(setting):
            return None
        if self.fresh and stored.run != self.run:
            return None
        return stored

    def save(
        self, setting: Setting, measurement: Measurement, seconds: float
    ) -> CalibrationOutcome:
        """Store ``measurement`` of ``setting`` (``seconds`` it took) atomically, replacing
        any entry (two processes that both measured store equally valid calibrations); a
        cache directory that cannot be written costs the reuse, with a
        :class:`CalibrationCacheWarning`."""
        entry, key = self.entry(setting), self.key(setting)
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        stored = StoredCalibration(key, measurement, round(seconds, 3), self.run, created)
        try:
            atomic_write(entry, json.dumps(stored.to_dict(), indent=1))
        except OSError as exc:
            _warn(
                f"the calibration cannot be stored at {entry} ({exc}); measured and used, "
                "not stored: the next run measures it again"
            )
            return CalibrationOutcome("measured", seconds, None, stored)
        return CalibrationOutcome("measured", seconds, entry, stored)


def _measure(
    key: Mapping[str, object], run: str, measure: Callable[[], Measurement], entry: Path
) -> CalibrationOutcome:
    started = time.perf_counter()
    measurement = measure()
    seconds = time.perf_counter() - started
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    stored = StoredCalibration(key, measurement, round(seconds, 3), run, created)
    return CalibrationOutcome("measured", seconds, entry, stored)


def _replace_entry(outcome: CalibrationOutcome) -> CalibrationOutcome:
    """``outcome``, saying it is not stored."""
    return CalibrationOutcome(outcome.source, outcome.seconds, None, outcome.stored)


def _warn(message: str) -> None:
    warnings.warn(CalibrationCacheWarning(message), stacklevel=3)
