"""An episode comparison (:mod:`~pytest_memeval.tools.compare.episodes`) as text: the runs
side by side, the paired test in words, the flipped episodes, and the slices."""

from __future__ import annotations

from pytest_memeval.core.formatting import columns, percent, score_text, shown_list
from pytest_memeval.core.records import RateBlock
from pytest_memeval.core.stats import describe_p
from pytest_memeval.tools.compare.episodes import (
    EpisodeComparison,
    EpisodeRunSummary,
    EpisodeSlices,
)

__all__ = ["format_episode_comparison"]


def _ci(block: RateBlock) -> str:
    ci = block.get("ci95")
    return "n/a" if not ci else f"[{percent(ci[0])}, {percent(ci[1])}]"


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else percent(value, decimals=1)


def _run_row(run: EpisodeRunSummary) -> list[str]:
    s = run["success"]
    return [
        run["label"],
        score_text(s["correct"], s["total"], s["rate"]),
        _ci(s),
        _number(run["mean_score"]),
        _number(run["mean_steps"]),
        _number(run["mean_steps_successful"]),
        _rate(run["invalid_action_rate"]),
    ]


def _header(result: EpisodeComparison) -> list[str]:
    env = result["env"]
    params = ",".join(f"{k}={v}" for k, v in (env.get("params") or {}).items()) or "default"
    lines = [
        f"A = {result['a']['label']} ({result['a']['path']})",
        f"B = {result['b']['label']} ({result['b']['path']})",
        f"environment: {env.get('backend')} {env.get('version', '')} {env.get('game')} "
        f"({params}), fold {env.get('fold')}: {result['n']} episode(s) paired by id",
    ]
    lines += [f"note: {note}" for note in result["notes"]]
    return lines


def _pair_lines(result: EpisodeComparison) -> list[str]:
    test, flips = result["mcnemar"], result["flips"]
    delta, ci = result["success_delta_pp"], result["success_delta_ci95_pp"]
    shown_ci = "" if ci is None else f", 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}] pp (paired, Newcombe)"
    lines = [
        f"success delta (B - A): {_number(delta, signed=True)} pp "
        f"({result['success_delta_episodes']:+d} episodes){shown_ci}",
        f"mean score delta (B - A): {_number(result['mean_score_delta'], signed=True)}; "
        f"mean steps delta (B - A): {_number(result['mean_steps_delta'], signed=True)}",
        f"paired test on success (exact McNemar): {test['fixed']} fixed, {test['broken']} "
        f"broken, {describe_p(test['p_value'], test['alpha'])}",
    ]
    mde = result["mde_pp"]
    if mde is None:
        lines.append(f"power: with {result['n']} episodes no success difference is detectable")
    else:
        lines.append(
            f"power: with {result['n']} episodes ({result['mde_basis']}) only success "
            f"differences of about {mde:.1f} pp or more are detectable (80% power, alpha "
            f"{test['alpha']:g})"
        )
    lines += [
        f"fixed  (failed in A, succeeded in B): {len(flips['fixed'])}: "
        f"{shown_list(flips['fixed'])}",
        f"broken (succeeded in A, failed in B): {len(flips['broken'])}: "
        f"{shown_list(flips['broken'])}",
    ]
    return lines


def _slice_lines(result: EpisodeSlices) -> list[str]:
    whole = result["whole_run_tags"]
    if not result["rows"]:
        return [
            "slices: no tag splits the episodes (every episode carries "
            f"{shown_list(whole)}); --slice TAG shows one anyway"
        ]
    method = "Holm" if result["method"] == "holm" else "Benjamini-Hochberg"
    lines = [
        f"slices: p-values {method}-adjusted over the {result['tests']} tests shown "
        f"({result['controls']} at {result['alpha']:g}); the delta's interval is paired "
        f"(Newcombe) at {result['ci_level']:.2%} (Bonferroni over the slices)"
    ]
    rows = [["slice", "n", "A success", "B success", "delta [CI]", "fixed/broken", "p (adj.)"]]
    for row in result["rows"]:
        a, b, ci = row["a"], row["b"], row["delta_ci_pp"]
        delta = "n/a" if row["delta_pp"] is None else f"{row['delta_pp']:+.2f} pp"
        if ci is not None:
            delta += f" [{ci[0]:+.1f}, {ci[1]:+.1f}]"
        rows.append(
            [
                row["slice"],
                str(row["n"]),
                score_text(a["correct"], a["total"], a["rate"]),
                score_text(b["correct"], b["total"], b["rate"]),
                delta,
                f"{row['fixed']}/{row['broken']}",
                f"{row['p_value']:.2g} ({row['p_adjusted']:.2g})",
            ]
        )
    lines += columns(rows)
    width = max(len(row["slice"]) for row in result["rows"])
    lines.append("verdicts (B - A):")
    lines += [f"  {row['slice'].ljust(width)}  {row['verdict']}" for row in result["rows"]]
    return lines


def format_episode_comparison(result: EpisodeComparison) -> str:
    """The comparison of two episode runs, as ``memeval compare`` prints it."""
    table = [
        [
            "run",
            "success",
            "95% CI (Wilson)",
            "mean score",
            "mean steps",
            "mean steps (successful)",
            "invalid actions",
        ],
        _run_row(result["a"]),
        _run_row(result["b"]),
    ]
    lines = [*_header(result), "", *columns(table), "", *_pair_lines(result)]
    lines += ["", *_slice_lines(result["slices"])]
    return "\n".join(lines)
