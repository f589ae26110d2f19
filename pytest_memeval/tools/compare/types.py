"""The comparison as data: what ``memeval compare --json`` prints, and its constants.

Every step of the comparison hands its result on as one of these types: a run's summary
(:class:`RunSummary`), a pair's statistics (:class:`Power`, :class:`McNemar`,
:class:`PairedM2`) and the pair itself (:class:`Comparison`), several runs against one
baseline (:class:`ManyComparison`, :class:`BoardRow`). Field meanings: docs/statistics.md.
"""

from __future__ import annotations

from typing import TypedDict

from pytest_memeval.core.records import Fingerprints, ParseFailCounts, PositionCounts, RateBlock
from pytest_memeval.core.results import CheckedRun

__all__ = [
    "ALPHA",
    "POWER",
    "BoardRow",
    "CompareError",
    "Comparison",
    "Correction",
    "Divergent",
    "Flips",
    "ManyComparison",
    "McNemar",
    "PairedM2",
    "Power",
    "RunData",
    "RunSummary",
]

#: Significance level the McNemar verdict is stated at.
ALPHA = 0.05
#: Power the minimum detectable difference is stated at.
POWER = 0.8


class CompareError(ValueError):
    """The runs cannot be compared honestly; the message says why."""


#: A checked run directory: its metrics and its records by scenario id (benchmark order).
RunData = CheckedRun


class RunSummary(TypedDict):
    """One run of a comparison (:func:`~.compare_stats.run_summary`)."""

    label: str
    path: str
    ckpt: str
    n: int
    m1: RateBlock
    m2: RateBlock
    parse_fail: ParseFailCounts
    unaligned: int
    fingerprints: Fingerprints
    m2_by_position: dict[str, PositionCounts]
    #: ``truth`` (teacher-forced) or ``model`` (free-running)
    history: str


class Power(TypedDict):
    """The minimum detectable m1 difference of a pair (:func:`~.compare_stats.m1_power`)."""

    mde_pp: float | None
    n: int
    discordant: int
    discordant_share: float
    alpha: float
    power: float
    basis: str
    method: str
    statement: str


class _McNemarFields(TypedDict):
    test: str
    fixed: int
    broken: int
    discordant: int
    p_value: float
    alpha: float
    significant: bool
    statement: str


class McNemar(_McNemarFields, total=False):
    """The exact McNemar test of a pair; ``p_holm`` and ``significant_holm`` when the pair
    is one of several runs compared with one baseline (:func:`~.compare_board.compare_many`)."""

    p_holm: float
    significant_holm: bool


class _PairedM2Fields(TypedDict):
    scenarios: int
    of: int
    not_comparable: int
    turns: int
    changed: int
    a: float | None
    b: float | None
    delta_pp: float | None
    ci95_pp: list[float] | None
    ci95_method: str | None
    test: str
    p_value: float | None
    alpha: float
    significant: bool | None
    statement: str


class PairedM2(_PairedM2Fields, total=False):
    """m2 compared paired by scenario (:func:`~.compare_stats.paired_m2`); Holm fields as in
    :class:`McNemar` (only where the pair has a p-value)."""

    p_holm: float
    significant_holm: bool


class Divergent(TypedDict):
    """The scenarios whose turn structure differs between the two runs."""

    count: int
    total: int
    ids: list[str]


class Flips(TypedDict):
    """Scenarios whose m1 outcome changed: fixed (wrong in A, right in B) and broken."""

    fixed: list[str]
    broken: list[str]


class Comparison(TypedDict):
    """Two runs compared (:func:`~.compare_pair.compare_runs`)."""

    a: RunSummary
    b: RunSummary
    n: int
    same_benchmark: bool
    notes: list[str]
    m1_delta_pp: float | None
    m1_delta_scenarios: int
    m1_delta_ci95_pp: list[float] | None
    m1_delta_ci95_method: str
    m1_mde_pp: float | None
    m1_power: Power
    m2_delta_pp: float | None
    m2_delta_over: str
    m2_paired: PairedM2
    divergent: Divergent
    final_gt_differs: list[str]
    mcnemar: McNemar
    flips: Flips


class _BoardRowFields(TypedDict):
    label: str
    path: str
    baseline: bool
    m1: RateBlock
    m2: RateBlock


class BoardRow(_BoardRowFields, total=False):
    """A leaderboard row: the baseline's has no pair fields; ``rank`` once sorted."""

    m1_delta_pp: float | None
    m1_delta_ci95_pp: list[float] | None
    m1_p: float
    m1_p_holm: float
    m1_mde_pp: float | None
    m2_paired_delta_pp: float | None
    m2_paired_scenarios: int
    m2_p_holm: float | None
    rank: int


class Correction(TypedDict):
    """How the p-values of :func:`~.compare_board.compare_many` were corrected."""

    method: str
    families: dict[str, int]
    alpha: float


class ManyComparison(TypedDict):
    """Several runs compared with one baseline (:func:`~.compare_board.compare_many`)."""

    baseline: RunSummary
    n: int
    runs: list[Comparison]
    correction: Correction
    leaderboard: list[BoardRow]
