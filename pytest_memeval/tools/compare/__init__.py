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
:mod:`.types` (what ``--json`` prints): :mod:`.load` loads the runs, refuses what cannot be
compared and labels the runs; :mod:`.scenarios` sets out what differs scenario by scenario;
:mod:`.stats` does each run's rates and a pair's paired tests and power; :mod:`.pair` puts a
pair together, :mod:`.board` several runs against a baseline; :mod:`.text` renders either as
text; :mod:`.slices` compares by slice, :mod:`.history` a teacher-forced run with its
free-running one; closed-loop runs are loaded by :mod:`.episode_runs`, compared paired by
episode by :mod:`.episodes` and rendered by :mod:`.episode_text`; scenario runs and episode
runs of the same models and seeds (teacher-forced, free-running, closed loop) are set side by
side by :mod:`.ways`, two models tested way by way by :mod:`.ways_pairs`, and rendered by
:mod:`.ways_text`; :mod:`.command` is the
command line. This package's ``__init__`` is its public face: it re-exports their names,
which callers and tests import from here, never from its modules.
"""

from __future__ import annotations

from pytest_memeval.tools.compare.board import compare_many
from pytest_memeval.tools.compare.episode_runs import (
    EPISODES_KIND,
    EpisodeRun,
    check_same_env,
    check_same_episodes,
    is_episode_run,
    load_episode_run,
    read_episode_run,
    read_metrics_kind,
    recount_episode_run,
    why_incomplete,
)
from pytest_memeval.tools.compare.episode_text import format_episode_comparison
from pytest_memeval.tools.compare.episodes import (
    EpisodeComparison,
    EpisodeRunSummary,
    EpisodeSliceRow,
    EpisodeSlices,
    compare_episode_runs,
)
from pytest_memeval.tools.compare.history import HistoryPair, format_history_pair, history_pair
from pytest_memeval.tools.compare.load import load_run
from pytest_memeval.tools.compare.pair import compare_runs, load_pair
from pytest_memeval.tools.compare.scenarios import turn_structure
from pytest_memeval.tools.compare.slices import (
    SliceComparison,
    compare_slices,
    format_slices,
    run_tags,
    slice_arguments,
)
from pytest_memeval.tools.compare.stats import m1_power, paired_m2, run_summary
from pytest_memeval.tools.compare.text import (
    fmt_ci,
    fmt_m2_ci,
    fmt_pp,
    fmt_pp_ci,
    fmt_rate,
    format_comparison,
    format_many,
    m2_delta_lines,
)
from pytest_memeval.tools.compare.types import (
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
from pytest_memeval.tools.compare.ways import (
    Carryover,
    ModelWays,
    Reproduced,
    SeedRow,
    SeedWays,
    WaysComparison,
    WaysSlice,
    compare_ways,
    load_ways,
    mixes_kinds,
)
from pytest_memeval.tools.compare.ways_pairs import WayDifference, WaysDifference
from pytest_memeval.tools.compare.ways_text import (
    DIFFERENCE_HEADER,
    carryover_lines,
    difference_rows,
    format_ways,
    rate_cell,
)

__all__ = [
    "ALPHA",
    "DIFFERENCE_HEADER",
    "EPISODES_KIND",
    "POWER",
    "BoardRow",
    "Carryover",
    "CompareError",
    "Comparison",
    "Correction",
    "Divergent",
    "EpisodeComparison",
    "EpisodeRun",
    "EpisodeRunSummary",
    "EpisodeSliceRow",
    "EpisodeSlices",
    "Flips",
    "HistoryPair",
    "ManyComparison",
    "McNemar",
    "ModelWays",
    "PairedM2",
    "Power",
    "Reproduced",
    "RunData",
    "RunSummary",
    "SeedRow",
    "SeedWays",
    "SliceComparison",
    "WayDifference",
    "WaysComparison",
    "WaysDifference",
    "WaysSlice",
    "carryover_lines",
    "check_same_env",
    "check_same_episodes",
    "compare_episode_runs",
    "compare_many",
    "compare_runs",
    "compare_slices",
    "compare_ways",
    "difference_rows",
    "fmt_ci",
    "fmt_m2_ci",
    "fmt_pp",
    "fmt_pp_ci",
    "fmt_rate",
    "format_comparison",
    "format_episode_comparison",
    "format_history_pair",
    "format_many",
    "format_slices",
    "format_ways",
    "history_pair",
    "is_episode_run",
    "load_episode_run",
    "load_pair",
    "load_run",
    "load_ways",
    "m1_power",
    "m2_delta_lines",
    "mixes_kinds",
    "paired_m2",
    "rate_cell",
    "read_episode_run",
    "read_metrics_kind",
    "recount_episode_run",
    "run_summary",
    "run_tags",
    "slice_arguments",
    "turn_structure",
    "why_incomplete",
]
