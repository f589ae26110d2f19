"""The three-ways comparison (:mod:`.ways`) as the terminal shows it."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_memeval.core.formatting import columns, percent, shown_ids
from pytest_memeval.core.records import RateBlock
from pytest_memeval.tools.compare.text import fmt_ci, fmt_pp, fmt_pp_ci, fmt_rate
from pytest_memeval.tools.compare.ways import Carryover, ModelWays, WaysComparison
from pytest_memeval.tools.compare.ways_pairs import WayDifference, WaysDifference

__all__ = ["difference_rows", "format_ways", "rate_cell"]

#: The header of the paired differences' table
DIFFERENCE_HEADER = ("model", "way", "B - A", "95% interval", "p", "p (Holm)")


def rate_cell(block: RateBlock | None) -> str:
    """``correct/total = rate [low, high]`` as every comparison words it; ``-`` for a way that
    was not run."""
    if block is None:
        return "-"
    interval = fmt_ci(block)
    return fmt_rate(block) if interval == "-" else f"{fmt_rate(block)} {interval}"


def _table(models: Sequence[ModelWays], first: str) -> list[list[str]]:
    rows = [[first, "m2 teacher-forced", "m2 free-running", "m1 final question", "success"]]
    for model in models:
        rows.append(
            [
                model["label"],
                rate_cell(model["m2_teacher_forced"]),
                rate_cell(model["m2_free_running"]),
                rate_cell(model["m1"]),
                rate_cell(model["success"]),
            ]
        )
    return rows


def carryover_lines(label: str, carry: Carryover) -> list[str]:
    """What the seeds say about per-turn accuracy predicting success, in words."""
    right = carry["both"] + carry["turns_only"]
    lines = [
        f"{label}: every turn right teacher-forced on {right} of {carry['seeds']} seeds, "
        f"{carry['both']} of them succeeded in the environment"
        + (
            f"; {carry['turns_only']} failed ({shown_ids(carry['turns_only_ids'])})"
            if carry["turns_only"]
            else ""
        ),
        f"  a wrong turn teacher-forced, yet succeeded: {carry['success_only']}"
        + (f" ({shown_ids(carry['success_only_ids'])})" if carry["success_only"] else ""),
    ]
    if carry["agreement"] is not None:
        lines.append(
            f"  'every turn right' agreed with the environment on "
            f"{percent(carry['agreement'], 1)} of the seeds"
        )
    of_s, of_f = carry["turn_accuracy_of_successes"], carry["turn_accuracy_of_failures"]
    lines.append(
        "  mean teacher-forced turn accuracy: "
        f"{'-' if of_s is None else percent(of_s, 1)} on the seeds that succeeded, "
        f"{'-' if of_f is None else percent(of_f, 1)} on those that failed"
    )
    return lines


def _reproduced_lines(model: ModelWays) -> list[str]:
    reproduced = model["free_running_reproduced"]
    if reproduced is None:
        return []
    line = (
        f"  free-running, the gold path reproduced on {reproduced['seeds']} seeds: "
        f"{reproduced['succeeded']} succeeded in the environment"
    )
    if reproduced["failed_ids"]:
        line += (
            f"; {len(reproduced['failed_ids'])} did not ({shown_ids(reproduced['failed_ids'])}): "
            "the same conversation cannot end otherwise, so the runs differ in their settings "
            "(generation, max_steps, the action read from an output)"
        )
    return [line]


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _verdict(way: WayDifference) -> str:
    if way["significant_holm"] is None:
        return _p(way["p_holm"])
    return f"{_p(way['p_holm'])} ({'differ' if way['significant_holm'] else 'no difference shown'})"


def difference_rows(differences: list[WaysDifference]) -> list[list[str]]:
    """One row per model after the first and way: B minus A, its interval, p and Holm's p."""
    return [
        [pair["b"], way["way"], fmt_pp(way["delta_pp"]), fmt_pp_ci(way["ci95_pp"]),
         _p(way["p_value"]), _verdict(way)]
        for pair in differences
        for way in pair["ways"]
    ]  # fmt: skip


def format_ways(result: WaysComparison) -> str:
    """The comparison as text: the table, the carry-over per model, then by slice."""
    lines = [
        f"One model, three ways, on the same {result['seeds']} seeds (paired by id): m2 "
        "and m1 with 95% intervals (m2 clustered by scenario, m1 and success Wilson)",
        "",
        *columns(_table(result["models"], "model")),
        "",
        "Does per-turn accuracy carry over to success? Seed by seed:",
    ]
    for model in result["models"]:
        lines += carryover_lines(model["label"], model["carryover"])
        lines += _reproduced_lines(model)
    if result["slices"]:
        lines += ["", "By slice (the benchmark's tags):"]
        rows = [["slice", "n", "model", "m2 teacher-forced", "m2 free-running", "m1", "success",
                 "agreement"]]  # fmt: skip
        for entry in result["slices"]:
            for model in entry["models"]:
                agreement = model["carryover"]["agreement"]
                rows.append(
                    [
                        entry["tag"],
                        str(entry["n"]),
                        model["label"],
                        rate_cell(model["m2_teacher_forced"]),
                        rate_cell(model["m2_free_running"]),
                        rate_cell(model["m1"]),
                        rate_cell(model["success"]),
                        "-" if agreement is None else percent(agreement, 1),
                    ]
                )
        lines += columns(rows)
    if result["differences"]:
        first = result["differences"][0]
        lines += [
            "",
            f"Paired against {first['a']} (A), seed by seed: m2 by the sign-flip test over the "
            "scenarios whose turns line up, m1 and success by McNemar's; p Holm-adjusted over "
            f"each model's ways (alpha {first['alpha']:g})",
            *columns([list(DIFFERENCE_HEADER), *difference_rows(result["differences"])]),
        ]
    return "\n".join(lines)
