"""``memeval compare RUN_A RUN_B``: two runs side by side, with the statistics done.

For each run: m1 and m2 as count/total and percent with a 95% Wilson interval, parse failures,
unaligned scenarios. Between them: the m1 delta in percentage points, the *divergent*
scenarios (whose turn structure, the number or content of the turns, differs between the two
runs), the exact McNemar test on the scenarios whose m1 outcome differs, stated in words, and
those scenarios by name (fixed: wrong in A, right in B; broken: the reverse).

Only complete runs that pass the independent recount are compared, and only over the same
scenario ids: anything else is refused with the reason. Two different benchmark files (the
baseline and the door-grounded variant of the same scenarios) are compared when their ids
match, and the output says the benchmarks differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .recount import RecountError, recount_run
from .rundir import METRICS, PREDICTIONS, read_json, read_predictions
from .stats import describe_p, mcnemar_exact, rate_with_ci

__all__ = [
    "ALPHA",
    "CompareError",
    "RunData",
    "cli_arguments",
    "cli_main",
    "compare_runs",
    "fmt_ci",
    "fmt_pp",
    "fmt_rate",
    "format_comparison",
    "load_pair",
    "load_run",
    "run_summary",
    "turn_structure",
]

#: Significance level the McNemar verdict is stated at.
ALPHA = 0.05
#: How many scenario ids a refusal or a flip list names before "...".
_SHOW = 20


class CompareError(ValueError):
    """The runs cannot be compared honestly; the message says why."""


@dataclass(frozen=True)
class RunData:
    """A checked run directory: its metrics and its records by scenario id (benchmark order)."""

    path: Path
    metrics: dict[str, Any]
    records: dict[str, dict[str, Any]]

    @property
    def ckpt(self) -> str:
        return str(self.metrics.get("ckpt", self.path.name))


def load_run(path: Path) -> RunData:
    """Load a run directory for comparison; raise :class:`CompareError` if it is not usable.

    Refused: a directory without ``metrics.json``/``predictions.jsonl``, one whose metrics
    disagree with the recount of its predictions, and an incomplete run (missing scenarios,
    a subset selected with ``-k``, or one shard).
    """
    if not path.is_dir():
        raise CompareError(f"{path}: not a run directory")
    try:
        recount_run(path)
        metrics = read_json(path / METRICS)
        records = {rec["id"]: rec for rec in read_predictions(path / PREDICTIONS)}
    except RecountError as exc:
        raise CompareError(f"{path}: fails the recount, refusing to compare it: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompareError(f"{path}: unreadable run: {exc}") from None
    if not isinstance(metrics, dict):
        raise CompareError(f"{path / METRICS}: not a metrics object")
    if metrics.get("complete") is not True:
        raise CompareError(
            f"{path}: incomplete run, refusing to compare it ({_why_incomplete(metrics)})"
        )
    return RunData(path=path, metrics=metrics, records=records)


def _why_incomplete(metrics: Mapping[str, Any]) -> str:
    missing = metrics.get("missing") or []
    if missing:
        return f"{len(missing)} scenario(s) have no result: {_ids(missing)}"
    scope = metrics.get("scope") or {}
    if scope.get("shard"):
        shard = scope["shard"]
        spec = shard.get("spec", shard) if isinstance(shard, dict) else shard
        return f"it is shard {spec}; merge the shards first (memeval merge)"
    if scope.get("subset"):
        return (
            f"only {scope.get('evaluated')} of {scope.get('in_scope')} scenarios were selected "
            "(-k or a deselection)"
        )
    return "metrics.json says complete: false"


def _ids(ids: Sequence[str], show: int = _SHOW) -> str:
    shown = ", ".join(ids[:show])
    return shown + (f" ... (+{len(ids) - show} more)" if len(ids) > show else "")


def turn_structure(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The turn structure a record was evaluated on: its turns' training targets, in order.

    Two runs *diverge* on a scenario when these differ: a different number of turns, or a
    turn with different content (e.g. an "open cabinet" inserted by the door-grounded data).
    Predictions play no part: the structure is what the model was asked, not what it said.
    """
    return tuple(str(turn.get("target", turn.get("gt"))) for turn in record["turns"])


def run_summary(label: str, run: RunData) -> dict[str, Any]:
    """The per-run part of a comparison: counts, rates and 95% intervals, fingerprints."""
    m = run.metrics
    return {
        "label": label,
        "path": str(run.path),
        "ckpt": run.ckpt,
        "n": m["n"],
        "m1": rate_with_ci(m["m1"]["correct"], m["m1"]["total"]),
        "m2": rate_with_ci(m["m2"]["correct"], m["m2"]["total"]),
        "parse_fail": dict(m["parse_fail"]),
        "unaligned": m["unaligned"],
        "fingerprints": dict(m.get("fingerprints") or {}),
        "m2_by_position": dict(m.get("m2_by_position") or {}),
    }


def _pp(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 100.0


def compare_runs(run_a: RunData, run_b: RunData) -> dict[str, Any]:
    """The comparison of two loaded runs as plain JSON data (what ``--json`` prints).

    Raises :class:`CompareError` when the runs cover different scenario ids.
    """
    ids_a, ids_b = list(run_a.records), list(run_b.records)
    if set(ids_a) != set(ids_b):
        only_a = [i for i in ids_a if i not in run_b.records]
        only_b = [i for i in ids_b if i not in run_a.records]
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in {run_a.path}: {_ids(only_a)}")
        if only_b:
            parts.append(f"{len(only_b)} only in {run_b.path}: {_ids(only_b)}")
        raise CompareError("the runs cover different scenarios: " + "; ".join(parts))
    labels = (run_a.ckpt, run_b.ckpt)
    if labels[0] == labels[1]:
        labels = (str(run_a.path), str(run_b.path))
    summary_a, summary_b = run_summary(labels[0], run_a), run_summary(labels[1], run_b)

    fixed: list[str] = []
    broken: list[str] = []
    divergent: list[str] = []
    answer_differs: list[str] = []
    for sid in ids_a:  # A's (benchmark) order
        rec_a, rec_b = run_a.records[sid], run_b.records[sid]
        ok_a, ok_b = rec_a["final_match"] is True, rec_b["final_match"] is True
        if ok_b and not ok_a:
            fixed.append(sid)
        elif ok_a and not ok_b:
            broken.append(sid)
        if turn_structure(rec_a) != turn_structure(rec_b):
            divergent.append(sid)
        if rec_a.get("final_gt") != rec_b.get("final_gt"):
            answer_differs.append(sid)

    fp_a = summary_a["fingerprints"].get("benchmark")
    fp_b = summary_b["fingerprints"].get("benchmark")
    same_benchmark = fp_a is not None and fp_a == fp_b
    notes = []
    if not same_benchmark:
        notes.append(
            f"different benchmarks ({fp_a} vs {fp_b}) with the same {len(ids_a)} scenario ids: "
            "compared as variants of the same scenarios"
        )
    if answer_differs:
        notes.append(
            f"{len(answer_differs)} scenario(s) have a different final ground truth in the two "
            f"runs, so m1 is not the same question there: {_ids(answer_differs)}"
        )
    if summary_a["m2"]["total"] != summary_b["m2"]["total"] or divergent:
        notes.append("m2 is scored over different turns in the two runs (see divergent, unaligned)")
    for label, run in zip(labels, (run_a, run_b), strict=True):
        flags = run.metrics.get("stop_flags", "present")
        if flags != "present":
            notes.append(
                f"{label} was replayed from predictions without stop flags ({flags}): its "
                "cut-off outputs were not detected, so its parse failures undercount"
            )

    p_value = mcnemar_exact(len(fixed), len(broken))
    n = len(ids_a)
    return {
        "a": summary_a,
        "b": summary_b,
        "n": n,
        "same_benchmark": same_benchmark,
        "notes": notes,
        "m1_delta_pp": _pp(summary_a["m1"]["rate"], summary_b["m1"]["rate"]),
        "m1_delta_scenarios": summary_b["m1"]["correct"] - summary_a["m1"]["correct"],
        "m2_delta_pp": _pp(summary_a["m2"]["rate"], summary_b["m2"]["rate"]),
        "divergent": {"count": len(divergent), "total": n, "ids": divergent},
        "final_gt_differs": answer_differs,
        "mcnemar": {
            "test": "exact McNemar (two-sided binomial on discordant scenarios)",
            "fixed": len(fixed),
            "broken": len(broken),
            "discordant": len(fixed) + len(broken),
            "p_value": p_value,
            "alpha": ALPHA,
            "significant": p_value < ALPHA,
            "statement": describe_p(p_value, ALPHA),
        },
        "flips": {"fixed": fixed, "broken": broken},
    }


# -- text ----------------------------------------------------------------------------------


def fmt_rate(block: Mapping[str, Any]) -> str:
    """``167/189 = 88.36%`` (or ``0/0 = n/a``)."""
    if block["rate"] is None:
        return f"{block['correct']}/{block['total']} = n/a"
    return f"{block['correct']}/{block['total']} = {block['rate'] * 100:.2f}%"


def fmt_ci(block: Mapping[str, Any]) -> str:
    """``[83.01%, 92.19%]`` (the 95% Wilson interval) or ``-``."""
    if block["ci95"] is None:
        return "-"
    low, high = block["ci95"]
    return f"[{low * 100:.2f}%, {high * 100:.2f}%]"


def fmt_pp(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f} pp"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def format_comparison(result: Mapping[str, Any]) -> str:
    """The human-readable comparison (what ``memeval compare`` prints without ``--json``)."""
    a, b = result["a"], result["b"]
    n = result["n"]
    lines = [f"A = {a['label']} ({a['path']})", f"B = {b['label']} ({b['path']})"]
    lines += [f"note: {note}" for note in result["notes"]]
    lines.append("")
    header = [
        "run",
        "m1 final-query",
        "m1 95% CI",
        "m2 turn-level",
        "m2 95% CI",
        "unaligned",
        "parse_fail (final/turns)",
    ]
    rows = [header]
    for run in (a, b):
        rows.append(
            [
                run["label"],
                fmt_rate(run["m1"]),
                fmt_ci(run["m1"]),
                fmt_rate(run["m2"]),
                fmt_ci(run["m2"]),
                f"{run['unaligned']}/{run['n']}",
                f"{run['parse_fail']['final']}/{run['parse_fail']['turns']}",
            ]
        )
    lines += _table(rows)
    lines.append("")
    d = result["m1_delta_scenarios"]
    plural = "s" if abs(d) != 1 else ""
    lines.append(f"m1 delta (B - A): {fmt_pp(result['m1_delta_pp'])} ({d:+d} scenario{plural})")
    lines.append(f"m2 delta (B - A): {fmt_pp(result['m2_delta_pp'])}")
    div = result["divergent"]
    lines.append(
        f"divergent: {div['count']}/{div['total']} scenarios have a different turn structure "
        "(number or content of turns) in the two runs"
    )
    mc = result["mcnemar"]
    if mc["discordant"] == 0:
        verdict = "no scenario changed its m1 outcome, so there is no evidence of a difference"
    elif mc["significant"]:
        verdict = (
            f"the m1 difference is unlikely to be chance alone (significant at {mc['alpha']:g})"
        )
    else:
        verdict = (
            f"the m1 difference is compatible with chance (not significant at {mc['alpha']:g}); "
            f"{mc['discordant']} changed scenario(s) out of {n} are not a strong signal"
        )
    lines.append(
        f"paired test on m1 (exact McNemar): {mc['fixed']} fixed, {mc['broken']} broken, "
        f"{mc['statement']}"
    )
    lines.append(f"  in words: {verdict}")
    flips = result["flips"]
    lines.append(
        f"fixed  (wrong in A, right in B): {len(flips['fixed'])}"
        + (f": {_ids(flips['fixed'])}" if flips["fixed"] else "")
    )
    lines.append(
        f"broken (right in A, wrong in B): {len(flips['broken'])}"
        + (f": {_ids(flips['broken'])}" if flips["broken"] else "")
    )
    return "\n".join(lines)


# -- CLI -----------------------------------------------------------------------------------


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``memeval compare``."""
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="run directory A (the reference)")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="run directory B (the candidate)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def load_pair(path_a: Path, path_b: Path) -> dict[str, Any]:
    """Load, check and compare two run directories (raises :class:`CompareError`)."""
    return compare_runs(load_run(path_a), load_run(path_b))


def cli_main(args: argparse.Namespace) -> int:
    """Run ``memeval compare``: 0 when compared, 2 when the runs cannot be compared."""
    try:
        result = load_pair(args.run_a, args.run_b)
    except CompareError as exc:
        print(f"memeval compare: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(format_comparison(result))
    return 0
