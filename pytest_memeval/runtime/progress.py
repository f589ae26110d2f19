"""Progress a person can read: scenarios done / total, rate and ETA, now and then.

pytest's own progress counts items, and under ``-n`` the line of dots says nothing about how
long an evaluation of thousands of scenarios has left. The controller prints, at most once per
``memeval_progress`` seconds (default 30; 0 turns it off) and only when a scenario finishes,

    memeval: 37/189 scenarios (19.6%), 0.84 scenarios/s, ETA 3m 01s

and the memeval section at the end says how many were evaluated, at what rate, and for an
unfinished run how long the rest would take. The lines are time-based, not per item: a run
of 5,000 scenarios prints a line per interval, not 5,000. They are printed with ``-q`` too
(a long run under ``-q`` still wants to show it is alive, as pytest's own percentage does)
and not with ``-qq``, where pytest itself stays silent.

While the run goes, the rate is measured from the first scenario record of this session on,
so model loading does not make the ETA look longer than the run has left; the end line uses
the session's wall time (loading included), the same as ``timing`` in ``metrics.json``.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from pytest_memeval.compat.pytest import line_in_progress
from pytest_memeval.core.formatting import per_second, percent

__all__ = [
    "DEFAULT_INTERVAL_S",
    "Progress",
    "format_duration",
    "interval_from",
    "seconds_setting",
]

DEFAULT_INTERVAL_S = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-progress",
        dest="memeval_progress",
        metavar="SECONDS",
        default=None,
        help="print 'scenarios done/total, rate, ETA' at most every SECONDS while the run goes "
        f"(default: memeval_progress ini, {DEFAULT_INTERVAL_S:g}; 0 turns it off)",
    )
    parser.addini(
        "memeval_progress",
        "seconds between progress lines during a run (0: none)",
        default=str(DEFAULT_INTERVAL_S),
    )


def seconds_setting(config: pytest.Config, dest: str, flag: str, ini: str) -> float:
    """A duration in seconds (>= 0, 0 meaning off) from option ``flag`` (stored as ``dest``),
    else from ini key ``ini``; a bad value is a usage error naming where it came from."""
    raw = config.getoption(dest, None)
    source = flag
    if raw is None:
        raw, source = config.getini(ini), f"{ini} (ini)"
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{source}: expected seconds (a number), got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise pytest.UsageError(f"{source}: expected seconds >= 0, got {raw!r}")
    return value


def interval_from(config: pytest.Config) -> float:
    """The progress interval in seconds (0: off); a bad value is a usage error."""
    return seconds_setting(config, "memeval_progress", "--memeval-progress", "memeval_progress")


def format_duration(seconds: float) -> str:
    """``42s``, ``3m 01s``, ``2h 05m``: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


class Progress:
    """Counts this session's scenarios and says, when asked, what a person wants to know.

    ``clock`` is injectable so the "at most once per interval" rule is tested without waits.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.done = 0
        self.first: float | None = None
        self.last: float | None = None
        self.printed_at: float | None = None

    def add(self) -> None:
        """One scenario record of this session reached the controller."""
        now = self.clock()
        if self.first is None:
            self.first = self.printed_at = now
        self.last = now
        self.done += 1

    def rate(self) -> float | None:
        """Scenarios per second since the first record (needs two records and some time)."""
        if self.first is None or self.last is None or self.done < 2:
            return None
        span = self.last - self.first
        return (self.done - 1) / span if span > 0 else None

    def line(self, total: int | None) -> str:
        """``37/189 scenarios (19.6%), 0.84 scenarios/s, ETA 3m 01s`` (parts it knows)."""
        parts = [f"{self.done}/{total if total is not None else '?'} scenarios"]
        if total:
            parts[0] += f" ({percent(self.done / total, decimals=1)})"
        rate = self.rate()
        if rate is not None:
            parts.append(per_second(rate))
            if total is not None and total >= self.done:
                parts.append(f"ETA {format_duration((total - self.done) / rate)}")
        return ", ".join(parts)

    def due(self) -> bool:
        """Whether a line is due now: the interval has passed since the last one (or the
        first record). Marks it printed."""
        if self.interval <= 0 or self.printed_at is None:
            return False
        now = self.clock()
        if now - self.printed_at < self.interval:
            return False
        self.printed_at = now
        return True

    def summary(self, total: int, left: int, wall_s: float) -> str:
        """The end-of-run line: how many of this session's scenarios were evaluated, at what
        rate over the whole session (model loading included), and for an unfinished run how
        long the ``left`` ones would take.

        The estimate uses the rate between the first and the last record, when there is one:
        the session's rate includes loading the model and the preflight, which a run of two
        scenarios under ``-k`` spends nearly all its time on, and would make the rest look
        hours long.
        """
        text = f"progress: {self.done}/{total} scenarios evaluated in {format_duration(wall_s)}"
        rate = self.done / wall_s if wall_s > 0 and self.done else None
        if rate is not None:
            text += f" ({per_second(rate)})"
        if left:
            text += f"; {left} not evaluated"
            pace = self.rate()
            if pace is not None:
                text += (
                    f": about {format_duration(left / pace)} more at {per_second(pace)} "
                    "(the rate once scenarios came in)"
                )
            elif rate is not None:
                text += f": about {format_duration(left / rate)} more at that rate"
        return text


class ProgressReporter:
    """Registered by the controller: prints a progress line when one is due.

    The controller counts records (:meth:`note`); the line is printed from
    ``pytest_runtest_logfinish``, after pytest has written the item's own outcome (xdist
    forwards that hook from its workers), so it never splits pytest's ``-v`` lines.
    """

    def __init__(
        self, progress: Progress, total: Callable[[], int | None], config: pytest.Config
    ) -> None:
        self.progress = progress
        self.total = total
        self.config = config

    def note(self) -> None:
        """Called by the controller for each new record of this session."""
        self.progress.add()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self) -> None:
        if self.config.get_verbosity() <= -2 or not self.progress.due():
            return
        tr: Any = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        # pytest's dots (and xdist's) leave the cursor mid-line without telling
        # ensure_newline(); start a line of our own, the dots go on below it.
        if line_in_progress(tr):  # compat.pytest
            tr.write("\n")
        tr.write(f"memeval: {self.progress.line(self.total())}\n", cyan=True)
