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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from pytest_memeval.core.formatting import columns, percent, score_text, shown_ids
from pytest_memeval.core.history import history_of, history_words, other_differences
from pytest_memeval.core.records import (
    Fingerprints,
    Metrics,
    ParseFailCounts,
    PositionCounts,
    RateBlock,
    Record,
)
from pytest_memeval.core.results import CheckedRun, RunLoadError, load_checked_run
from pytest_memeval.core.stats import (
    CLUSTER_METHOD,
    METHOD_WORDS,
    Z95,
    ClusterSums,
    cluster_se,
    clustered_rate_with_ci,
    describe_p,
    holm,
    mcnemar_exact,
    mde_paired_binary,
    min_detectable_drop,
    paired_diff_interval,
    rate_with_ci,
    sign_flip_p,
)

__all__ = [
    "ALPHA",
    "BoardRow",
    "CompareError",
    "Comparison",
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
    "paired_m2",
    "run_summary",
    "turn_structure",
]

#: Significance level the McNemar verdict is stated at.
ALPHA = 0.05
#: Power the minimum detectable difference is stated at.
POWER = 0.8
#: How many scenario ids a refusal or a flip list names before "...".


class CompareError(ValueError):
    """The runs cannot be compared honestly; the message says why."""


#: A checked run directory: its metrics and its records by scenario id (benchmark order).
RunData = CheckedRun


# -- the comparison as data (what ``--json`` prints; docs/statistics.md) ---------------------


class RunSummary(TypedDict):
    """One run of a comparison (:func:`run_summary`)."""

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
    """The minimum detectable m1 difference of a pair (:func:`m1_power`)."""

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
    is one of several runs compared with one baseline (:func:`compare_many`)."""

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
    """m2 compared paired by scenario (:func:`paired_m2`); Holm fields as in :class:`McNemar`
    (only where the pair has a p-value)."""

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
    """Two runs compared (:func:`compare_runs`)."""

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
    """How the p-values of :func:`compare_many` were corrected."""

    method: str
    families: dict[str, int]
    alpha: float


class ManyComparison(TypedDict):
    """Several runs compared with one baseline (:func:`compare_many`)."""

    baseline: RunSummary
    n: int
    runs: list[Comparison]
    correction: Correction
    leaderboard: list[BoardRow]


def load_run(path: Path) -> RunData:
    """Load a run directory for comparison; raise :class:`CompareError` if it is not usable.

    Refused: whatever :func:`~pytest_memeval.core.results.load_checked_run` refuses (no run
    directory, no ``metrics.json``/``predictions.jsonl``, a malformed file or record, metrics
    that disagree with the recount of the predictions), and an incomplete run (missing
    scenarios, a subset selected with ``-k``, or one shard).
    """
    try:
        run = load_checked_run(path)
    except RunLoadError as exc:
        raise CompareError(str(exc)) from None
    if run.metrics.get("complete") is not True:
        raise CompareError(
            f"{path}: incomplete run, refusing to compare it ({_why_incomplete(run.metrics)})"
        )
    return run


def _why_incomplete(metrics: Metrics) -> str:
    missing = metrics.get("missing") or []
    if missing:
        return f"{len(missing)} scenario(s) have no result: {shown_ids(missing)}"
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


def turn_structure(record: Record) -> tuple[str, ...]:
    """The turn structure a record was evaluated on: its turns' training targets, in order.

    Two runs *diverge* on a scenario when these differ: a different number of turns, or a
    turn with different content (e.g. an "open cabinet" inserted by the door-grounded data).
    Predictions play no part: the structure is what the model was asked, not what it said.
    """
    return tuple(str(turn.get("target", turn.get("gt"))) for turn in record["turns"])


def _scored_turns(record: Record) -> tuple[int, int]:
    """(right, scored) turns of a record for m2: aligned scenarios only."""
    if record.get("aligned") is not True:
        return 0, 0
    scored = [t["match"] for t in record["turns"] if t["match"] is not None]
    return sum(m is True for m in scored), len(scored)


def run_summary(label: str, run: RunData) -> RunSummary:
    """The per-run part of a comparison: counts, rates and 95% intervals, fingerprints.

    m1's interval is Wilson's (one outcome per scenario); m2's is clustered by scenario
    (``ci95_method`` says which, ``clusters`` how many scenarios its turns come from).
    """
    m = run.metrics
    m2_clusters = ClusterSums.of(_scored_turns(rec) for rec in run.records.values())
    fingerprints: Fingerprints = m.get("fingerprints") or {}
    return {
        "label": label,
        "path": str(run.path),
        "ckpt": run.ckpt,
        "n": m["n"],
        "m1": rate_with_ci(m["m1"]["correct"], m["m1"]["total"]),
        "m2": clustered_rate_with_ci(m["m2"]["correct"], m2_clusters),
        "parse_fail": m["parse_fail"].copy(),
        "unaligned": m["unaligned"],
        "fingerprints": fingerprints.copy(),
        "m2_by_position": dict(m.get("m2_by_position") or {}),
        "history": history_of(m),
    }


def _pp(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 100.0


def compare_runs(run_a: RunData, run_b: RunData) -> Comparison:
    """The comparison of two loaded runs as plain JSON data (what ``--json`` prints).

    Raises :class:`CompareError` when the runs cover different scenario ids, or differ in
    their history (teacher-forced, free-running) and in anything else as well. Two runs of
    one checkpoint that differ only in their history are compared as a pair of the same
    scenarios (labelled ``<ckpt> (teacher-forced)`` / ``<ckpt> (free-running)``;
    :mod:`.history_compare` reads the gap off the result).
    """
    _same_ids(run_a, run_b)
    _one_question(run_a, run_b)
    labels = (run_a.ckpt, run_b.ckpt)
    histories = (history_of(run_a.metrics), history_of(run_b.metrics))
    if histories[0] != histories[1]:
        labels = (
            f"{labels[0]} ({history_words(histories[0])})",
            f"{labels[1]} ({history_words(histories[1])})",
        )
    if labels[0] == labels[1]:
        labels = (str(run_a.path), str(run_b.path))
    return _compare(run_a, run_b, labels)


def _one_question(run_a: RunData, run_b: RunData) -> None:
    """Refuse two runs whose histories differ when anything else differs too: the gap would
    mix the history's effect with the other difference's."""
    ha, hb = history_of(run_a.metrics), history_of(run_b.metrics)
    if ha == hb:
        return
    differ = other_differences(run_a.metrics, run_b.metrics)
    if differ:
        raise CompareError(
            f"A ({run_a.path}) is {history_words(ha)} (history {ha}) and B ({run_b.path}) "
            f"{history_words(hb)} (history {hb}), and they differ in more than that: "
            + "; ".join(differ)
            + ". Compare runs of one history, or the two histories of one checkpoint "
            "(memeval compare runs/<ckpt> runs/<ckpt>@history-model)"
        )


def _same_ids(run_a: RunData, run_b: RunData) -> None:
    ids_a, ids_b = list(run_a.records), list(run_b.records)
    if set(ids_a) != set(ids_b):
        only_a = [i for i in ids_a if i not in run_b.records]
        only_b = [i for i in ids_b if i not in run_a.records]
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in {run_a.path}: {shown_ids(only_a)}")
        if only_b:
            parts.append(f"{len(only_b)} only in {run_b.path}: {shown_ids(only_b)}")
        raise CompareError("the runs cover different scenarios: " + "; ".join(parts))


def _compare(run_a: RunData, run_b: RunData, labels: tuple[str, str]) -> Comparison:
    ids_a = list(run_a.records)
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
            f"runs, so m1 is not the same question there: {shown_ids(answer_differs)}"
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
    both_right = summary_a["m1"]["correct"] - len(broken)
    m1_delta_pp = _pp(summary_a["m1"]["rate"], summary_b["m1"]["rate"])
    power = m1_power(n, len(fixed) + len(broken), m1_delta_pp)
    m2 = paired_m2(run_a, run_b, ids_a)
    m2_a, m2_b = summary_a["m2"], summary_b["m2"]
    return {
        "a": summary_a,
        "b": summary_b,
        "n": n,
        "same_benchmark": same_benchmark,
        "notes": notes,
        "m1_delta_pp": m1_delta_pp,
        "m1_delta_scenarios": summary_b["m1"]["correct"] - summary_a["m1"]["correct"],
        "m1_delta_ci95_pp": (
            [
                v * 100
                for v in paired_diff_interval(
                    both_right, len(fixed), len(broken), n - both_right - len(fixed) - len(broken)
                )
            ]
            if n
            else None
        ),
        "m1_delta_ci95_method": "Newcombe (1998) paired hybrid score (method 10)",
        "m1_mde_pp": power["mde_pp"],
        "m1_power": power,
        # The difference of the two runs' overall m2, each over its own scored turns: not
        # paired; "m2_paired" is the comparison on the same turns.
        "m2_delta_pp": _pp(m2_a["rate"], m2_b["rate"]),
        "m2_delta_over": (
            f"all scored turns of each run, unpaired (A: {m2_a['total']} turns in "
            f"{m2_a['clusters']} scenarios; B: {m2_b['total']} turns in {m2_b['clusters']} "
            "scenarios)"
        ),
        "m2_paired": m2,
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


def m1_power(n: int, discordant: int, observed_pp: float | None) -> Power:
    """The minimum detectable m1 difference of a paired comparison, in numbers and words.

    Connor's formula (:func:`~pytest_memeval.core.stats.mde_paired_binary`) at the observed
    discordant share; where no scenario changed, the best case (every change one way,
    :func:`~pytest_memeval.core.stats.min_detectable_drop`) and the basis says so.
    """
    share = discordant / n if n else 0.0
    if discordant:
        mde = mde_paired_binary(n, share, ALPHA, POWER)
        basis = "observed discordant share"
        where = (
            f"with {n} scenarios and {percent(share, decimals=1)} of them ({discordant}) "
            "changing their m1 outcome"
        )
    else:
        mde = min_detectable_drop(n, ALPHA, POWER)
        basis = "no scenario changed: best case, every change in one direction"
        where = (
            f"no scenario changed its m1 outcome; even if every change went one way, {n} scenarios"
        )
    mde_pp = None if mde is None else mde * 100
    if mde_pp is None:
        statement = f"{where}: no m1 difference is detectable at {POWER:.0%} power"
    else:
        statement = (
            f"{where}, this comparison can only detect m1 differences of about {mde_pp:.1f} pp "
            f"or more ({POWER:.0%} power, alpha {ALPHA:g})"
        )
        if observed_pp is not None and discordant:
            below = abs(observed_pp) < mde_pp
            statement += f"; the observed {observed_pp:+.2f} pp is " + (
                "below that: too small for this sample to show" if below else "above that"
            )
    return {
        "mde_pp": mde_pp,
        "n": n,
        "discordant": discordant,
        "discordant_share": share,
        "alpha": ALPHA,
        "power": POWER,
        "basis": basis,
        "method": "Connor (1987) sample size for the paired (McNemar) design, solved for delta",
        "statement": statement,
    }


def paired_m2(run_a: RunData, run_b: RunData, ids: Sequence[str]) -> PairedM2:
    """m2 compared paired by scenario, on the scenarios both runs score on the same turns.

    Comparable: aligned in both runs, the same turn structure (:func:`turn_structure`) and
    the same turns scored. Each such scenario gives ``d_c`` (B's right turns minus A's) over
    ``n_c`` turns; the delta is ``sum d_c / sum n_c``, its interval cluster-robust (the
    sandwich SE of that ratio, by scenario), its p-value the exact sign-flip permutation
    test of ``sum d_c``. Other scenarios are "not comparable" for m2 and counted.
    """
    diffs: list[tuple[int, int]] = []
    right_a = right_b = 0
    for sid in ids:
        rec_a, rec_b = run_a.records[sid], run_b.records[sid]
        if rec_a.get("aligned") is not True or rec_b.get("aligned") is not True:
            continue
        if turn_structure(rec_a) != turn_structure(rec_b):
            continue
        scored_a = [t["match"] is not None for t in rec_a["turns"]]
        if scored_a != [t["match"] is not None for t in rec_b["turns"]] or not any(scored_a):
            continue
        ya, n_c = _scored_turns(rec_a)
        yb, _ = _scored_turns(rec_b)
        diffs.append((yb - ya, n_c))
        right_a += ya
        right_b += yb
    sums = ClusterSums.of(diffs)
    out: PairedM2 = {
        "scenarios": sums.clusters,
        "of": len(ids),
        "not_comparable": len(ids) - sums.clusters,
        "turns": sums.n,
        "changed": sum(1 for d, _ in diffs if d),
        "a": None,
        "b": None,
        "delta_pp": None,
        "ci95_pp": None,
        "ci95_method": None,
        "test": "exact paired sign-flip permutation test of the summed per-scenario differences",
        "p_value": None,
        "alpha": ALPHA,
        "significant": None,
        "statement": "no scenario is scored on the same turns in both runs: m2 not comparable",
    }
    if not sums.n:
        return out
    delta = sums.s / sums.n
    se = cluster_se(sums)
    p = sign_flip_p([d for d, _ in diffs])
    # No interval from one scenario, nor where every scenario differs alike (SE 0: the
    # sandwich would claim a point; say "n/a" rather than a certainty nobody has).
    ci = None if se is None or se == 0 else [(delta - Z95 * se) * 100, (delta + Z95 * se) * 100]
    out["a"] = right_a / sums.n
    out["b"] = right_b / sums.n
    out["delta_pp"] = delta * 100
    out["ci95_pp"] = ci
    out["ci95_method"] = None if ci is None else CLUSTER_METHOD
    out["p_value"] = p
    out["significant"] = p < ALPHA
    out["statement"] = describe_p(p, ALPHA)
    return out


def _labels(runs: Sequence[RunData]) -> list[str]:
    """Checkpoint names, or the paths where names repeat."""
    names = [run.ckpt for run in runs]
    if len(set(names)) == len(names):
        return names
    return [str(run.path) for run in runs]


def compare_many(baseline: RunData, runs: Sequence[RunData]) -> ManyComparison:
    """Each run against the baseline, Holm-corrected, and a leaderboard sorted by m1.

    The m1 (McNemar) p-values form one family and the paired m2 p-values another; each is
    corrected with Holm's step-down method over the runs compared (``p_holm`` beside each
    ``p_value``). Raises :class:`CompareError` if any run covers other scenario ids.
    """
    histories = [history_of(run.metrics) for run in (baseline, *runs)]
    if len(set(histories)) > 1:
        shown = ", ".join(
            f"{run.path}: {history_words(h)}"
            for run, h in zip((baseline, *runs), histories, strict=True)
        )
        raise CompareError(
            f"the runs mix teacher-forced and free-running results ({shown}); a leaderboard "
            "ranks runs of one history. Compare the two histories of one checkpoint on their "
            "own: memeval compare RUN_TRUTH RUN_MODEL"
        )
    labels = _labels([baseline, *runs])
    pairs: list[Comparison] = []
    for run, label in zip(runs, labels[1:], strict=True):
        _same_ids(baseline, run)
        pairs.append(_compare(baseline, run, (labels[0], label)))
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
            "families": {"m1": len(pairs), "m2": len(m2_pairs)},
            "alpha": ALPHA,
        },
        "leaderboard": board,
    }


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


# -- text ----------------------------------------------------------------------------------


def fmt_rate(block: RateBlock) -> str:
    """``167/189 = 88.36%`` (or ``0/0 = n/a``)."""
    return score_text(block["correct"], block["total"], block["rate"])


def fmt_ci(block: RateBlock) -> str:
    """``[83.01%, 92.19%]`` (the 95% Wilson interval) or ``-``."""
    if block["ci95"] is None:
        return "-"
    low, high = block["ci95"]
    return f"[{percent(low)}, {percent(high)}]"


def fmt_pp(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f} pp"


def fmt_pp_ci(ci: Sequence[float] | None) -> str:
    """``[-2.01, +4.12] pp`` or ``-``."""
    return "-" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}] pp"


def fmt_m2_ci(block: RateBlock) -> str:
    """m2's interval with the number of scenarios (clusters) its turns come from."""
    if block["ci95"] is None:
        return "-"
    method = str(block.get("ci95_method"))
    how = METHOD_WORDS.get(method, method).replace(" by scenario", "")
    return f"{fmt_ci(block)} ({how}, {block.get('clusters')} scenarios)"


def m2_delta_lines(result: Comparison) -> list[str]:
    """The m2 lines of a pair: the unpaired overall delta and the paired one, each with
    what it was computed over (never a bare m2 delta)."""
    lines = [f"m2 delta (B - A), {result['m2_delta_over']}: {fmt_pp(result['m2_delta_pp'])}"]
    m2 = result["m2_paired"]
    rate_a, rate_b = m2["a"], m2["b"]  # given exactly when delta_pp is (paired_m2)
    if m2["delta_pp"] is None or rate_a is None or rate_b is None:
        lines.append(f"m2 paired (B - A): {m2['statement']} (0 of {m2['of']} scenarios)")
    else:
        line = (
            f"m2 paired (B - A) over the {m2['scenarios']} of {m2['of']} scenarios scored on "
            f"the same turns in both runs ({m2['turns']} turns): A {percent(rate_a)}, "
            f"B {percent(rate_b)}, delta {fmt_pp(m2['delta_pp'])}"
        )
        if m2["ci95_pp"] is not None:
            line += f", 95% CI {fmt_pp_ci(m2['ci95_pp'])} (clustered by scenario)"
        elif m2["changed"] == 0:
            line += ", 95% CI n/a (no compared scenario changed its m2 score)"
        else:
            line += ", 95% CI n/a (one scenario, or every scenario differs alike)"
        line += f"; exact sign-flip permutation test: {m2['statement']}"
        if "p_holm" in m2:
            line += f" (Holm-adjusted p = {m2['p_holm']:.4g})"
        lines.append(line)
    if m2["not_comparable"]:
        lines.append(
            f"  m2 not comparable on {m2['not_comparable']} scenario(s): different turn "
            "structure, or unaligned in a run"
        )
    return lines


def format_comparison(result: Comparison) -> str:
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
        "m2 95% CI (by scenario)",
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
                fmt_m2_ci(run["m2"]),
                f"{run['unaligned']}/{run['n']}",
                f"{run['parse_fail']['final']}/{run['parse_fail']['turns']}",
            ]
        )
    lines += columns(rows)
    lines.append("")
    d = result["m1_delta_scenarios"]
    plural = "s" if abs(d) != 1 else ""
    lines.append(
        f"m1 delta (B - A): {fmt_pp(result['m1_delta_pp'])} ({d:+d} scenario{plural}), "
        f"95% CI {fmt_pp_ci(result['m1_delta_ci95_pp'])} (paired, Newcombe)"
    )
    lines += m2_delta_lines(result)
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
    if "p_holm" in mc:
        lines.append(
            f"  Holm-adjusted over the compared runs: p = {mc['p_holm']:.4g}: "
            + ("significant" if mc["significant_holm"] else "not significant")
            + f" at {mc['alpha']:g}"
        )
    lines.append(f"  in words: {verdict}")
    lines.append(f"power: {result['m1_power']['statement']}")
    flips = result["flips"]
    lines.append(
        f"fixed  (wrong in A, right in B): {len(flips['fixed'])}"
        + (f": {shown_ids(flips['fixed'])}" if flips["fixed"] else "")
    )
    lines.append(
        f"broken (right in A, wrong in B): {len(flips['broken'])}"
        + (f": {shown_ids(flips['broken'])}" if flips["broken"] else "")
    )
    return "\n".join(lines)


def format_many(result: ManyComparison) -> str:
    """The text of ``memeval compare BASELINE RUN RUN ...``: leaderboard, then each pair."""
    base = result["baseline"]
    k = len(result["runs"])
    lines = [
        f"baseline = {base['label']} ({base['path']}), {k} run(s) compared with it over "
        f"{result['n']} scenarios; paired p-values Holm-corrected over the {k} runs",
        "",
        "leaderboard (by m1):",
    ]
    rows = [
        [
            "#",
            "run",
            "m1 final-query",
            "m1 95% CI",
            "m1 delta vs baseline",
            "delta 95% CI",
            "McNemar p (Holm)",
            "m1 MDE",
            "m2 turn-level",
            "m2 95% CI (by scenario)",
        ]
    ]
    for row in result["leaderboard"]:
        base_row = row["baseline"]
        rows.append(
            [
                str(row["rank"]),
                row["label"] + (" (baseline)" if base_row else ""),
                fmt_rate(row["m1"]),
                fmt_ci(row["m1"]),
                "" if base_row else fmt_pp(row["m1_delta_pp"]),
                "" if base_row else fmt_pp_ci(row["m1_delta_ci95_pp"]),
                "" if base_row else f"{row['m1_p']:.4g} ({row['m1_p_holm']:.4g})",
                "" if base_row or row["m1_mde_pp"] is None else f"{row['m1_mde_pp']:.1f} pp",
                fmt_rate(row["m2"]),
                fmt_m2_ci(row["m2"]),
            ]
        )
    lines += columns(rows)
    for pair in result["runs"]:
        lines += [
            "",
            f"== {pair['b']['label']} vs baseline {base['label']} ==",
            format_comparison(pair),
        ]
    return "\n".join(lines)


def load_pair(path_a: Path, path_b: Path) -> Comparison:
    """Load, check and compare two run directories (raises :class:`CompareError`)."""
    return compare_runs(load_run(path_a), load_run(path_b))
