"""Several runs against one baseline: ``memeval compare BASELINE RUN RUN ...``.

Each run is compared with the baseline as a pair (:func:`~.compare_pair.compare_pair`); the
pairs' m1 (McNemar) p-values form one family and their paired m2 p-values another, each
corrected with Holm's step-down method over the runs compared; and a leaderboard sorts the
runs, baseline included, by m1. Runs of two histories are refused: a leaderboard ranks runs
of one history.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_memeval.core.stats import holm
from pytest_memeval.tools.compare.load import (
    PairLabels,
    check_one_history,
    check_same_ids,
    run_labels,
)
from pytest_memeval.tools.compare.pair import compare_pair
from pytest_memeval.tools.compare.stats import run_summary
from pytest_memeval.tools.compare.types import (
    ALPHA,
    BoardRow,
    Comparison,
    ManyComparison,
    RunData,
    RunSummary,
)

__all__ = ["compare_many"]


def compare_many(baseline: RunData, runs: Sequence[RunData]) -> ManyComparison:
    """Each run against the baseline, Holm-corrected, and a leaderboard sorted by m1.

    The m1 (McNemar) p-values form one family and the paired m2 p-values another; each is
    corrected with Holm's step-down method over the runs compared (``p_holm`` beside each
    ``p_value``). Raises :class:`~pytest_memeval.tools.compare.types.CompareError` if any run
    covers other scenario ids.
    """
    check_one_history([baseline, *runs])
    labels = run_labels([baseline, *runs])
    pairs: list[Comparison] = []
    for run, label in zip(runs, labels[1:], strict=True):
        check_same_ids(baseline, run)
        pairs.append(compare_pair(baseline, run, PairLabels(labels[0], label)))
    m2_family = _holm_correct(pairs)
    base = pairs[0]["a"] if pairs else run_summary(labels[0], baseline)
    board = [_board_row(base, None)] + [_board_row(p["b"], p) for p in pairs]
    board.sort(key=lambda row: -(row["m1"]["rate"] or 0.0))
    for rank, row in enumerate(board, start=1):
        row["rank"] = rank
    return {
        "baseline": base,
        "n": baseline.metrics["n"],
        "runs": pairs,
        "correction": {
            "method": "Holm (1979) step-down, family-wise error rate",
            "families": {"m1": len(pairs), "m2": m2_family},
            "alpha": ALPHA,
        },
        "leaderboard": board,
    }


def _holm_correct(pairs: Sequence[Comparison]) -> int:
    """Add the Holm-adjusted p-values to each pair's McNemar test and, where it has a
    p-value, to its paired m2; return the size of the m2 family."""
    m1_adj = holm([p["mcnemar"]["p_value"] for p in pairs])
    for pair, adj in zip(pairs, m1_adj, strict=True):
        pair["mcnemar"]["p_holm"] = adj
        pair["mcnemar"]["significant_holm"] = adj < ALPHA
    m2_tested = [(p, m2_p) for p in pairs if (m2_p := p["m2_paired"]["p_value"]) is not None]
    m2_pairs = [p for p, _ in m2_tested]
    m2_adj = holm([m2_p for _, m2_p in m2_tested])
    for pair, adj in zip(m2_pairs, m2_adj, strict=True):
        pair["m2_paired"]["p_holm"] = adj
        pair["m2_paired"]["significant_holm"] = adj < ALPHA
    return len(m2_pairs)


def _board_row(summary: RunSummary, pair: Comparison | None) -> BoardRow:
    row: BoardRow = {
        "label": summary["label"],
        "path": summary["path"],
        "baseline": pair is None,
        "m1": summary["m1"],
        "m2": summary["m2"],
    }
    if pair is not None:
        row["m1_delta_pp"] = pair["m1_delta_pp"]
        row["m1_delta_ci95_pp"] = pair["m1_delta_ci95_pp"]
        row["m1_p"] = pair["mcnemar"]["p_value"]
        row["m1_p_holm"] = pair["mcnemar"]["p_holm"]
        row["m1_mde_pp"] = pair["m1_mde_pp"]
        row["m2_paired_delta_pp"] = pair["m2_paired"]["delta_pp"]
        row["m2_paired_scenarios"] = pair["m2_paired"]["scenarios"]
        row["m2_p_holm"] = pair["m2_paired"].get("p_holm")
    return row
