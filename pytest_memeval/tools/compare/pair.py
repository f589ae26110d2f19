"""Two runs compared: ``memeval compare RUN_A RUN_B``, as the plain data ``--json`` prints.

:func:`compare_runs` checks the pair (:mod:`.compare_load`), labels it, and puts together
each run's summary, the per-scenario differences (:mod:`.compare_scenarios`), the paired
statistics (:mod:`.compare_stats`) and the notes a reader needs to read them honestly
(different benchmarks, a different final ground truth, m2 over different turns, a replay
without stop flags). :func:`load_pair` does it from two run directories.
"""

from __future__ import annotations

from pathlib import Path

from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.tools.compare.load import (
    PairLabels,
    check_one_question,
    check_same_ids,
    load_run,
    pair_labels,
)
from pytest_memeval.tools.compare.scenarios import ScenarioDiff, diff_scenarios
from pytest_memeval.tools.compare.stats import (
    m1_delta_interval,
    m1_power,
    mcnemar,
    paired_m2,
    pp_delta,
    run_summary,
)
from pytest_memeval.tools.compare.types import Comparison, RunData, RunSummary

__all__ = ["compare_pair", "compare_runs", "load_pair"]


def compare_runs(run_a: RunData, run_b: RunData) -> Comparison:
    """The comparison of two loaded runs as plain JSON data (what ``--json`` prints).

    Raises :class:`~pytest_memeval.tools.compare.types.CompareError` when the runs cover
    different scenario ids, or differ in their history (teacher-forced, free-running) and in
    anything else as well. Two runs of one checkpoint that differ only in their history are
    compared as a pair of the same scenarios (labelled ``<ckpt> (teacher-forced)`` /
    ``<ckpt> (free-running)``; :mod:`.history_compare` reads the gap off the result).
    """
    check_same_ids(run_a, run_b)
    check_one_question(run_a, run_b)
    return compare_pair(run_a, run_b, pair_labels(run_a, run_b))


def load_pair(path_a: Path, path_b: Path) -> Comparison:
    """Load, check and compare two run directories (raises
    :class:`~pytest_memeval.tools.compare.types.CompareError`)."""
    return compare_runs(load_run(path_a), load_run(path_b))


def compare_pair(run_a: RunData, run_b: RunData, labels: PairLabels) -> Comparison:
    """Two runs over the same scenario ids compared, unchecked (the caller has checked them)."""
    ids_a = list(run_a.records)  # A's (benchmark) order
    summary_a, summary_b = run_summary(labels.a, run_a), run_summary(labels.b, run_b)
    diff = diff_scenarios(run_a, run_b, ids_a)
    n = len(ids_a)
    fixed, broken = len(diff.fixed), len(diff.broken)
    m1_delta_pp = pp_delta(summary_a["m1"]["rate"], summary_b["m1"]["rate"])
    power = m1_power(n, fixed + broken, m1_delta_pp)
    m2_a, m2_b = summary_a["m2"], summary_b["m2"]
    return {
        "a": summary_a,
        "b": summary_b,
        "n": n,
        "same_benchmark": _same_benchmark(summary_a, summary_b),
        "notes": _notes(run_a, run_b, summary_a, summary_b, diff),
        "m1_delta_pp": m1_delta_pp,
        "m1_delta_scenarios": summary_b["m1"]["correct"] - summary_a["m1"]["correct"],
        "m1_delta_ci95_pp": m1_delta_interval(n, summary_a["m1"]["correct"], fixed, broken),
        "m1_delta_ci95_method": "Newcombe (1998) paired hybrid score (method 10)",
        "m1_mde_pp": power["mde_pp"],
        "m1_power": power,
        # The difference of the two runs' overall m2, each over its own scored turns: not
        # paired; "m2_paired" is the comparison on the same turns.
        "m2_delta_pp": pp_delta(m2_a["rate"], m2_b["rate"]),
        "m2_delta_over": (
            f"all scored turns of each run, unpaired (A: {m2_a['total']} turns in "
            f"{m2_a['clusters']} scenarios; B: {m2_b['total']} turns in {m2_b['clusters']} "
            "scenarios)"
        ),
        "m2_paired": paired_m2(run_a, run_b, ids_a),
        "divergent": {"count": len(diff.divergent), "total": n, "ids": diff.divergent},
        "final_gt_differs": diff.answer_differs,
        "mcnemar": mcnemar(fixed, broken),
        "flips": {"fixed": diff.fixed, "broken": diff.broken},
    }


def _same_benchmark(summary_a: RunSummary, summary_b: RunSummary) -> bool:
    fp_a = summary_a["fingerprints"].get("benchmark")
    return fp_a is not None and fp_a == summary_b["fingerprints"].get("benchmark")


def _notes(
    run_a: RunData,
    run_b: RunData,
    summary_a: RunSummary,
    summary_b: RunSummary,
    diff: ScenarioDiff,
) -> list[str]:
    """What a reader must know to read the pair's numbers (``notes``)."""
    notes = []
    if not _same_benchmark(summary_a, summary_b):
        fp_a = summary_a["fingerprints"].get("benchmark")
        fp_b = summary_b["fingerprints"].get("benchmark")
        notes.append(
            f"different benchmarks ({fp_a} vs {fp_b}) with the same {len(run_a.records)} "
            "scenario ids: compared as variants of the same scenarios"
        )
    if diff.answer_differs:
        notes.append(
            f"{len(diff.answer_differs)} scenario(s) have a different final ground truth in "
            f"the two runs, so m1 is not the same question there: "
            f"{shown_ids(diff.answer_differs)}"
        )
    if summary_a["m2"]["total"] != summary_b["m2"]["total"] or diff.divergent:
        notes.append("m2 is scored over different turns in the two runs (see divergent, unaligned)")
    for summary, run in ((summary_a, run_a), (summary_b, run_b)):
        flags = run.metrics.get("stop_flags", "present")
        if flags != "present":
            notes.append(
                f"{summary['label']} was replayed from predictions without stop flags "
                f"({flags}): its cut-off outputs were not detected, so its parse failures "
                "undercount"
            )
    return notes
