"""Issue 14's statistics against independent computations, then through compare/report/gate.

References used only here: statsmodels (cluster-robust OLS standard errors, Holm), scipy
(the exact permutation test), published worked examples (Fagerland, Lydersen & Laake's paired
interval, the seed's table), hand-worked values and brute-force enumeration.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.core.stats import (
    CLUSTER_METHOD,
    WILSON_SCENARIOS_METHOD,
    ClusterSums,
    cluster_se,
    clustered_rate_with_ci,
    holm,
    mcnemar_exact,
    mde_paired_binary,
    min_detectable_drop,
    paired_diff_interval,
    sign_flip_p,
)
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import compare_many, load_pair, load_run
from pytest_memeval.tools.gate import Baseline, GateSettings, resolution_warnings

from ..conftest import MemevalProject, demo_records
from ..pages import INJECTED, Page
from ..runfactory import (
    SEED_TABLE_BROKEN,
    SEED_TABLE_FIXED,
    make_record,
    seed_runs,
    write_crafted,
    write_run,
)


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# Imported once, at collection: pytester restores sys.modules after each test, and numpy's
# extension modules cannot be imported a second time in one process. Optional: only the
# tests against these references skip without them (the compare/report/gate tests still run).
np = _optional("numpy")
sm = _optional("statsmodels.api")
multitest = _optional("statsmodels.stats.multitest")
scipy_stats = _optional("scipy.stats")
needs_references = pytest.mark.skipif(
    None in (np, sm, multitest, scipy_stats),
    reason="the reference implementations (numpy, statsmodels, scipy) are not installed",
)


def _statsmodels_cluster(scores: list[float], groups: list[int]) -> tuple[float, float, Any]:
    """Mean, cluster-robust SE and 95% interval of ``scores`` by ``groups``: OLS on a constant
    with statsmodels' cluster covariance (its default small-sample factor G/(G-1))."""
    res = sm.OLS(np.asarray(scores, float), np.ones((len(scores), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": np.asarray(groups)}
    )
    return float(res.params[0]), float(res.bse[0]), res.conf_int(alpha=0.05)[0]


def _random_clusters(seed: int, g: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(g):
        p = rng.uniform(0.2, 0.97)
        out.append([int(rng.random() < p) for _ in range(rng.randint(1, 14))])
    return out


# -- clustered m2 interval ----------------------------------------------------------------


@needs_references
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cluster_se_matches_statsmodels_and_millers_formula(seed: int) -> None:
    clusters = _random_clusters(seed, 25 + 20 * seed)
    scores = [s for c in clusters for s in c]
    groups = [i for i, c in enumerate(clusters) for _ in c]
    sums = ClusterSums.of((sum(c), len(c)) for c in clusters)
    block = clustered_rate_with_ci(sum(scores), sums)
    mean, se, (low, high) = _statsmodels_cluster([float(s) for s in scores], groups)
    assert block["rate"] == pytest.approx(mean, rel=1e-12)
    assert cluster_se(sums) == pytest.approx(se, rel=1e-10)
    assert block["ci95"] == pytest.approx([low, high], rel=1e-10)
    assert block["ci95_method"] == CLUSTER_METHOD and block["clusters"] == len(clusters)
    # Miller (2024): SE^2 = naive SE^2 + (1/n^2) * sum of within-cluster cross products.
    n, m = len(scores), mean
    naive = sum((s - m) ** 2 for s in scores) / n**2
    cross = sum(
        (a - m) * (b - m)
        for c in clusters
        for i, a in enumerate(c)
        for j, b in enumerate(c)
        if i != j
    )
    g = len(clusters)
    assert cluster_se(sums) == pytest.approx(math.sqrt(g / (g - 1) * (naive + cross / n**2)))


def test_clustered_interval_can_be_wider_or_narrower_than_wilson() -> None:
    from pytest_memeval.core.stats import wilson_interval

    # Scenarios all-right or all-wrong: turns are perfectly correlated -> much wider.
    polar = [(10, 10)] * 15 + [(0, 10)] * 5
    wide = clustered_rate_with_ci(150, ClusterSums.of(polar))["ci95"]
    # Every scenario 7 or 8 of 10 right: less spread than coin flips -> narrower.
    even = [(7, 10), (8, 10)] * 10
    narrow = clustered_rate_with_ci(150, ClusterSums.of(even))["ci95"]
    naive = wilson_interval(150, 200)
    assert wide[1] - wide[0] > 1.5 * (naive[1] - naive[0])
    assert narrow[1] - narrow[0] < 0.5 * (naive[1] - naive[0])


def test_all_turns_right_falls_back_to_wilson_over_scenarios() -> None:
    block = clustered_rate_with_ci(60, ClusterSums.of([(3, 3)] * 20))
    assert block["ci95_method"] == WILSON_SCENARIOS_METHOD
    # Wilson 20/20 (Newcombe 1998, Table I method 3 gives 0.8389 for 20/20).
    assert block["ci95"][0] == pytest.approx(0.8389, abs=5e-5) and block["ci95"][1] == 1.0


# -- paired tests and intervals ---------------------------------------------------------------


@needs_references
def test_seed_table_mcnemar_and_minimum_detectable_difference() -> None:
    assert mcnemar_exact(6, 4) == pytest.approx(0.75390625, abs=0)  # 2 * 386 / 1024
    mde = mde_paired_binary(189, 10 / 189)
    assert mde is not None and 0.04 < mde < 0.05  # "roughly 4-5 pp" (issue 14)
    # Connor (1987) from the definition: the power at that delta is 80%.
    norm = scipy_stats.norm
    p = 10 / 189
    power = norm.cdf(
        (math.sqrt(189) * mde - norm.ppf(0.975) * math.sqrt(p)) / math.sqrt(p - mde**2)
    )
    assert power == pytest.approx(0.80, abs=1e-6)
    assert mde_paired_binary(189, 0) is None
    best = min_detectable_drop(189)
    assert best is not None and best < mde  # one-way changes are easier to detect
    assert min_detectable_drop(4) is None  # 4 scenarios cannot detect anything at 80% power


def test_newcombe_paired_interval_matches_the_published_example() -> None:
    # Fagerland, Lydersen & Laake (2017), ch. 8 (Cavo et al. 2012): 59, 6, 16, 80 ->
    # estimate -0.0621, 95% CI -0.1186 to -0.0046 (Newcombe square-and-add).
    low, high = paired_diff_interval(59, 6, 16, 80)
    assert (round(low, 4), round(high, 4)) == (-0.1186, -0.0046)


@needs_references
@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_p_matches_scipy_and_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    diffs = [rng.randint(-4, 5) for _ in range(rng.randint(3, 11))]
    brute = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= abs(sum(diffs))
        for signs in itertools.product((1, -1), repeat=len(diffs))
    ) / 2 ** len(diffs)
    assert sign_flip_p(diffs) == pytest.approx(brute, rel=1e-12)
    x, y = np.zeros(len(diffs)), np.asarray(diffs, float)
    ref = scipy_stats.permutation_test(
        (y, x),
        lambda a, b, axis: np.sum(a - b, axis=axis),
        permutation_type="samples",
        n_resamples=10**6,
        alternative="two-sided",
        vectorized=True,
    )
    assert sign_flip_p(diffs) == pytest.approx(ref.pvalue, rel=1e-9)


def test_sign_flip_p_scales_to_a_full_benchmark() -> None:
    diffs = [(-1) ** i * (i % 7) for i in range(400)] + [3] * 15
    p = sign_flip_p(diffs)  # 2^400 sign assignments, counted exactly
    assert 0 < p < 1 and sign_flip_p([0, 0]) == 1.0 and sign_flip_p([5]) == 1.0


def test_sign_flip_normal_approximation_agrees_with_the_exact_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pytest_memeval.core.stats as stats

    rng = random.Random(5)
    for shift in (0, 1, 3):
        diffs = [rng.randint(-3, 3) for _ in range(400)] + [1] * (10 * shift)
        exact = sign_flip_p(diffs)
        monkeypatch.setattr(stats, "_EXACT_BUDGET", 0)
        approx = sign_flip_p(diffs)
        monkeypatch.undo()
        assert approx == pytest.approx(exact, abs=2e-3)


@needs_references
def test_holm_matches_statsmodels_and_holms_example() -> None:
    rng = random.Random(7)
    ps = [rng.random() ** 3 for _ in range(12)]
    assert holm(ps) == pytest.approx(list(multitest.multipletests(ps, method="holm")[1]), rel=1e-12)
    # Textbook: 0.01, 0.04, 0.03, 0.005 -> 0.03, 0.06, 0.06, 0.02.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


# -- compare: the seed's table, paired m2, many runs ---------------------------------------


def test_compare_states_what_the_seed_table_can_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = seed_runs(tmp_path, SEED_TABLE_FIXED, SEED_TABLE_BROKEN)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "m1 delta (B - A): +1.06 pp (+2 scenarios)" in out
    assert "6 fixed, 4 broken, p = 0.7539: not significant at 0.05" in out
    assert (
        "power: with 189 scenarios and 5.3% of them (10) changing their m1 outcome, this "
        "comparison can only detect m1 differences of about 4.7 pp or more (80% power, alpha "
        "0.05); the observed +1.06 pp is below that" in out
    )
    # m2: the 24 scenarios with the same turns are compared paired; 165 are not comparable.
    assert "m2 paired (B - A) over the 24 of 189 scenarios scored on the same turns" in out
    assert "m2 not comparable on 165 scenario(s)" in out
    assert "m2 delta (B - A), all scored turns of each run, unpaired (A: 567 turns in 189" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["m1_mde_pp"] == pytest.approx(mde_paired_binary(189, 10 / 189) * 100)  # type: ignore[operator]
    assert data["mcnemar"]["p_value"] == pytest.approx(0.7539, abs=5e-5)
    low, high = data["m1_delta_ci95_pp"]
    assert low < 0 < high  # the interval of +1.06 pp spans zero
    assert data["m2_paired"]["scenarios"] == 24 and data["m2_paired"]["not_comparable"] == 165
    assert data["b"]["m2"]["clusters"] == 24 and data["a"]["m2"]["clusters"] == 189


def _varied_runs(tmp: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Two runs over 30 scenarios with varied turn outcomes; 4 scenarios diverge."""
    rng = random.Random(11)
    recs_a, recs_b = [], []
    expect: dict[str, Any] = {"diffs": [], "scores": [], "groups": []}
    for i in range(30):
        k = rng.randint(2, 6)
        targets = [f"pick item{j} from shelf{i}" for j in range(k)]
        ta = [rng.random() < 0.7 for _ in range(k)]
        tb = [rng.random() < 0.8 for _ in range(k)]
        sid = f"odd id/{i} [x]"
        recs_a.append(
            make_record(sid, i, final_match=rng.random() < 0.6, targets=targets, turn_matches=ta)
        )
        if i < 4:  # divergent: B was asked one more turn
            recs_b.append(
                make_record(
                    sid, i, final_match=True, targets=[*targets, "open door"], chain=targets
                )
            )
            continue
        recs_b.append(
            make_record(sid, i, final_match=rng.random() < 0.7, targets=targets, turn_matches=tb)
        )
        expect["diffs"].append(sum(tb) - sum(ta))
        for x, y in zip(ta, tb, strict=True):
            expect["scores"].append(float(y) - float(x))
            expect["groups"].append(i)
    return (
        write_run(tmp / "a", recs_a, ckpt="a"),
        write_run(tmp / "b", recs_b, ckpt="b"),
        expect,
    )


@needs_references
def test_paired_m2_against_independent_computations(tmp_path: Path) -> None:
    a, b, expect = _varied_runs(tmp_path)
    result = load_pair(a, b)
    m2 = result["m2_paired"]
    assert (m2["scenarios"], m2["not_comparable"]) == (26, 4)
    mean, _se, (low, high) = _statsmodels_cluster(expect["scores"], expect["groups"])
    assert m2["delta_pp"] == pytest.approx(mean * 100)
    assert m2["ci95_pp"] == pytest.approx([low * 100, high * 100], rel=1e-9)
    assert m2["p_value"] == pytest.approx(sign_flip_p(expect["diffs"]))
    assert m2["turns"] == len(expect["scores"])
    # Each run's m2 interval is clustered over its aligned scenarios.
    assert result["a"]["m2"]["clusters"] == 30 and result["b"]["m2"]["clusters"] == 26


@needs_references
def test_compare_many_holm_and_leaderboard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, good, _ = _varied_runs(tmp_path / "one")
    # A third run: everything right, a clear improvement; a fourth: the baseline itself.
    recs = [dict(r, final_match=True) for r in load_run(base).records.values()]
    for r in recs:
        r["final_pred"] = r["final_gt"]
    best = write_run(tmp_path / "best", recs, ckpt="best<script>")
    same = write_run(tmp_path / "same", list(load_run(base).records.values()), ckpt="same")
    runs = [load_run(p) for p in (good, best, same)]
    result = compare_many(load_run(base), runs)
    raw = [p["mcnemar"]["p_value"] for p in result["runs"]]
    assert [p["mcnemar"]["p_holm"] for p in result["runs"]] == pytest.approx(
        list(multitest.multipletests(raw, method="holm")[1])
    )
    rates = [row["m1"]["rate"] for row in result["leaderboard"]]
    assert rates == sorted(rates, reverse=True) and len(rates) == 4
    assert result["leaderboard"][0]["label"] == "best<script>"
    assert sum(row["baseline"] for row in result["leaderboard"]) == 1
    assert main(["compare", str(base), str(good), str(best), str(same), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["runs"]) == 3 and data["correction"]["families"]["m1"] == 3
    assert all("m1_mde_pp" in pair and "m2_paired" in pair for pair in data["runs"])
    assert main(["compare", str(base), str(good), str(best), str(same)]) == 0
    out = capsys.readouterr().out
    assert "leaderboard (by m1):" in out and "Holm-adjusted over the compared runs" in out
    assert out.count("== ") == 3


def test_report_many_runs_one_page(tmp_path: Path) -> None:
    base, good, _ = _varied_runs(tmp_path / "one")
    recs = list(load_run(good).records.values())
    recs[5] = dict(recs[5], final_pred=INJECTED, final_match=False)
    evil = write_run(tmp_path / "evil", recs, ckpt="ev<b>il")
    out = tmp_path / "many.html"
    assert main(["report", str(base), str(good), str(evil), "-o", str(out)]) == 0
    text = out.read_text("utf-8")
    page = Page(text)
    assert not [t for t in page.tags if t[0] in ("script", "img")]
    assert "ev<b>il" in "".join(page.text) and "ev<b>il" not in text
    forest = [a for t, a in page.tags if t == "svg" and a.get("class") == "forest-plot"]
    assert len(forest) == 1
    assert [a["data-run"] for t, a in page.tags if t == "g" and a.get("class") == "forest-row"]
    rows = [a for t, a in page.tags if t == "tr" and "run" in (a.get("class") or "").split()]
    assert len(rows) == 3
    assert sum(1 for t, _ in page.tags if t == "details") == 2
    visible = " ".join(page.text)
    assert "Holm-adjusted p" in visible and "m2 paired (B - A) over the 26 of 30" in visible
    assert "s-" not in "".join(a.get("href", "") or "" for _, a in page.tags)  # no dead links


def test_two_run_report_shows_paired_m2_and_power(tmp_path: Path) -> None:
    a, b = seed_runs(tmp_path, SEED_TABLE_FIXED, SEED_TABLE_BROKEN)
    out = tmp_path / "two.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    visible = " ".join(Page(out.read_text("utf-8")).text)
    assert "about 4.7 pp" in visible and "p = 0.7539" in visible
    assert "over the 24 of 189 scenarios" in visible and "(paired, Newcombe)" in visible


# -- metrics.json, recount, terminal, gate ---------------------------------------------------


def test_recount_checks_the_interval_and_accepts_runs_without_one(tmp_path: Path) -> None:
    a, _b, _ = _varied_runs(tmp_path)
    metrics = json.loads((a / "metrics.json").read_text("utf-8"))
    assert metrics["m2"]["ci95_method"] == CLUSTER_METHOD and metrics["m2"]["clusters"] == 30
    doctored = json.loads(json.dumps(metrics))
    doctored["m2"]["ci95"][0] -= 0.01
    (a / "metrics.json").write_text(json.dumps(doctored), "utf-8")
    with pytest.raises(RecountError, match="m2: metrics say"):
        recount_run(a)
    old = json.loads(json.dumps(metrics))  # a run written before the intervals existed
    for key in ("m1", "m2"):
        for field in ("ci95", "ci95_method", "clusters"):
            old[key].pop(field, None)
    (a / "metrics.json").write_text(json.dumps(old), "utf-8")
    recount_run(a)


def test_gate_resolution_warnings() -> None:
    outcomes = {f"s{i}": i % 10 != 0 for i in range(189)}
    base = Baseline(Path("ref"), (170, 189), (0, 0), outcomes)
    from fractions import Fraction

    warned = resolution_warnings(GateSettings(baseline=base, max_drop=Fraction(1)))
    assert len(warned) == 1 and "smaller than what the baseline's 189 scenarios" in warned[0]
    assert "4.1 pp" in warned[0] and "may flap" in warned[0]
    assert resolution_warnings(GateSettings(baseline=base, max_drop=Fraction(5))) == []
    run = dict(outcomes)
    for sid in ("s0", "s10", "s20", "s1", "s2", "s3", "s4", "s5"):
        run[sid] = not run[sid]
    after = resolution_warnings(GateSettings(baseline=base, max_drop=Fraction(3)), run)
    assert after and "8 of 189 scenarios changed" in after[-1]


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]])
def test_end_to_end_interval_summary_and_gate_warning(
    memeval_project: MemevalProject, tmp_path: Path, xdist: list[str]
) -> None:
    recs = demo_records("baseline", 4)
    write_crafted(memeval_project, recs, wrong_turn=[recs[0]["id"], recs[2]["id"]])
    ref = write_run(
        tmp_path / "ref",
        [make_record(r["id"], i, final_match=True) for i, r in enumerate(recs)],
        ckpt="ref",
    )
    result = memeval_project.run(
        "--ckpt", "crafted", f"--memeval-baseline={ref}", "--memeval-max-drop", "2", *xdist
    )
    m2 = memeval_project.metrics("crafted")["m2"]
    # The interval from predictions.jsonl, computed by statsmodels.
    scores, groups = [], []
    for g, rec in enumerate(memeval_project.predictions("crafted")):
        for turn in rec["turns"]:
            if rec["aligned"] and turn["match"] is not None:
                scores.append(float(turn["match"]))
                groups.append(g)
    assert m2["ci95_method"] == CLUSTER_METHOD and m2["clusters"] == 4
    if sm is not None:  # the reference is optional; the run and its summary are checked anyway
        _mean, _se, (low, high) = _statsmodels_cluster(scores, groups)
        assert m2["ci95"] == pytest.approx([max(0.0, low), min(1.0, high)], rel=1e-9)
    result.stdout.fnmatch_lines(
        [
            f"m2 turn-level:  {m2['correct']}/{m2['total']} = *% *(aligned scenarios only)",
            f"*95% CI *, clustered by scenario: {m2['total']} turns in 4 scenarios",
            "*memeval gate*",
            "WARN  --memeval-max-drop 2 pp is smaller than what the baseline's 4 scenarios can "
            "resolve*may flap*",
        ]
    )


@pytest.mark.slow
def test_real_model_runs_compared_paired(
    memeval_project: MemevalProject, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo checkpoint with and without its adapter on the same 3 scenarios (one run
    under xdist): every scenario has the same turns, so m2 is compared paired on all of them,
    and the numbers agree with statsmodels on the two runs' predictions."""
    memeval_project.write(variant="baseline", n=3)
    assert memeval_project.run("--ckpt", "demo").ret in (0, 1)
    assert memeval_project.run("--ckpt", "base", "-n", "2").ret in (0, 1)
    base, demo = memeval_project.run_dir("base"), memeval_project.run_dir("demo")
    capsys.readouterr()  # pytester's own "running: ..." lines
    assert main(["compare", str(base), str(demo), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    preds_a = {r["id"]: r for r in memeval_project.predictions("base")}
    preds_b = {r["id"]: r for r in memeval_project.predictions("demo")}
    scores, groups, flips = [], [], [0, 0]
    for g, sid in enumerate(preds_a):
        ra, rb = preds_a[sid], preds_b[sid]
        flips[0] += rb["final_match"] and not ra["final_match"]
        flips[1] += ra["final_match"] and not rb["final_match"]
        for ta, tb in zip(ra["turns"], rb["turns"], strict=True):
            if ra["aligned"] and ta["match"] is not None:
                scores.append(float(tb["match"]) - float(ta["match"]))
                groups.append(g)
    m2 = data["m2_paired"]
    assert m2["scenarios"] == 3 and m2["not_comparable"] == 0 and m2["turns"] == len(scores)
    assert m2["delta_pp"] == pytest.approx(100 * sum(scores) / len(scores))
    if m2["ci95_pp"] is not None and sm is not None:  # the reference is optional
        _mean, _se, (low, high) = _statsmodels_cluster(scores, groups)
        assert m2["ci95_pp"] == pytest.approx([low * 100, high * 100], rel=1e-9)
    assert (data["mcnemar"]["fixed"], data["mcnemar"]["broken"]) == tuple(flips)
    assert data["m1_mde_pp"] is None  # 3 scenarios: nothing is detectable, and it says so
    assert "no m1 difference is detectable" in data["m1_power"]["statement"]


def test_pytest_html_summary_shows_clustered_interval_and_gate_warning() -> None:
    from pytest_memeval.core.metrics import Tally
    from pytest_memeval.tools.gate import GateCheck, GateOutcome
    from pytest_memeval.tools.report import summary_html

    records = [
        make_record(f"s{i}", i, final_match=i % 2 == 0, turn_matches=[True, i % 3 == 0])
        for i in range(6)
    ]
    metrics = {"ckpt": "c<k>", "complete": True, **Tally().extend(records).counts()}
    gate = GateOutcome(checks=[GateCheck("m1", True, "ok")], warnings=["may <flap>"])
    html = summary_html(metrics, gate)
    m2 = metrics["m2"]
    assert m2["ci95_method"] == CLUSTER_METHOD and m2["clusters"] == 6
    assert f"clustered by scenario: {m2['total']} turns in 6 scenarios" in html
    assert "Wilson over 6 scenarios" in html
    assert "WARN: may &lt;flap&gt;" in html and "c&lt;k&gt;" in html
