"""``memeval compare RUN_A RUN_B [RUN ...]``: runs side by side, with the statistics done.

For each run: m1 (95% Wilson interval) and m2 (95% interval clustered by scenario) as
count/total and percent, parse failures, unaligned scenarios. Between A and B: the m1 delta in
percentage points with its paired interval, the *divergent* scenarios (whose turn structure,
the number or content of the turns, differs between the two runs), the exact McNemar test on
the scenarios whose m1 outcome differs, stated in words, the smallest m1 difference the
comparison could detect (power), m2 compared paired by scenario over the scenarios both runs
score on the same turns, and the flipped scenarios by name (fixed: wrong in A, right in B;
broken: the reverse). With more than two runs, each is compared with the first (the
baseline), the paired p-values are Holm-corrected, and a leaderboard sorts them by m1.
Formulas and references: docs/statistics.md.

Only complete runs that pass the independent recount are compared, and only over the same
scenario ids: anything else is refused with the reason. Two different benchmark files (the
baseline and the door-grounded variant of the same scenarios) are compared when their ids
match, and the output says the benchmarks differ.

The comparison is split by concern, one module each, handing on the typed records of
:mod:`.compare_types` (what ``--json`` prints): :mod:`.compare_load` loads the runs, refuses
what cannot be compared and labels the runs; :mod:`.compare_scenarios` sets out what differs
scenario by scenario; :mod:`.compare_stats` does each run's rates and a pair's paired tests
and power; :mod:`.compare_pair` puts a pair together, :mod:`.compare_board` several runs
against a baseline; :mod:`.compare_text` renders either as text. This module is the public
face: it re-exports their names, which callers and tests import from here.
"""

from __future__ import annotations

from pytest_memeval.tools.compare_board import compare_many
from pytest_memeval.tools.compare_load import load_run
from pytest_memeval.tools.compare_pair import compare_runs, load_pair
from pytest_memeval.tools.compare_scenarios import turn_structure
from pytest_memeval.tools.compare_stats import m1_power, paired_m2, run_summary
from pytest_memeval.tools.compare_text import (
    fmt_ci,
    fmt_m2_ci,
    fmt_pp,
    fmt_pp_ci,
    fmt_rate,
    format_comparison,
    format_many,
    m2_delta_lines,
)
from pytest_memeval.tools.compare_types import (
    ALPHA,
    POWER,
    BoardRow,
    CompareError,
    Comparison,
    Correction,
    Divergent,
    Flips,
    ManyComparison,
    McNemar,
    PairedM2,
    Power,
    RunData,
    RunSummary,
)

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
    "compare_many",
    "compare_runs",
    "fmt_ci",
    "fmt_m2_ci",
    "fmt_pp",
    "fmt_pp_ci",
    "fmt_rate",
    "format_comparison",
    "format_many",
    "load_pair",
    "load_run",
    "m1_power",
    "m2_delta_lines",
    "paired_m2",
    "run_summary",
    "turn_structure",
]
