"""Closed-loop runs compared, recounted and gated (tools/compare, tools/recount_command.py,
tools/gate), on run directories written by ``finalize_episode_run`` from real episodes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import pytest

from pytest_memeval.core.episode_records import (
    EpisodeRunMetrics,
    episode_record,
    finalize_episode_run,
)
from pytest_memeval.core.stats import adjust_p, mcnemar_exact, wilson_interval
from pytest_memeval.env import EnvSpec, Episode, StepRecord, TerminationReason, parse_env_spec
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.compare import (
    CompareError,
    compare_episode_runs,
    format_episode_comparison,
    load_episode_run,
)
from pytest_memeval.tools.gate import (
    EpisodeBaseline,
    EpisodeGateSettings,
    episode_gate_settings,
    evaluate_episode_gate,
)

from ..runfactory import make_record, write_run

TABLE = {
    "backend": "textworld_express",
    "game": "twc",
    "params": "numLocations=1,numItemsToPutAway=2",
    "fold": "test",
    "seeds": "0-9",
}
SPEC = parse_env_spec(TABLE)


def _episode(seed: int, success: bool, steps: int, *, error: bool = False) -> Episode:
    reason = TerminationReason.SUCCESS if success else TerminationReason.STEP_LIMIT
    if error:
        reason = TerminationReason.ENV_ERROR
    trajectory = tuple(
        StepRecord(f"act {n}", f"obs {n}", 0.0, 0.0, success, False) for n in range(steps)
    )
    return Episode(
        seed=seed,
        reason=reason,
        steps=trajectory,
        observation=f"room {seed}",
        messages=({"role": "system", "content": "task"}, {"role": "user", "content": "room"}),
        score=1.0 if success else 0.5,
        error="EnvError: gone" if error else None,
    )


def _run(
    path: Path,
    won: set[int],
    *,
    spec: EnvSpec = SPEC,
    profile: str = "a",
    errors: Sequence[int] = (),
    seeds: Sequence[int] | None = None,
    hard: Sequence[int] = (),
) -> Path:
    """A run directory of ``spec``: the seeds in ``won`` succeed in 3 steps, the others
    use 4; ``hard`` seeds carry the extra tag ``difficulty:hard``."""
    ran = list(spec.seeds if seeds is None else seeds)
    records = {
        f"twc-{s}": episode_record(
            spec,
            _episode(s, s in won, 3 if s in won else 4, error=s in errors),
            ["difficulty:hard"] if s in hard else ["difficulty:easy"],
        )
        for s in ran
    }
    path.mkdir(parents=True)
    finalize_episode_run(
        path,
        profile=profile,
        env={**spec.as_plain(), "version": "1.1.0"},
        fingerprints={"model": f"sha256:{profile}"},
        ids=[f"twc-{s}" for s in spec.seeds],
        records=records,
        wall_s=1.0,
    )
    return path


def test_two_runs_are_paired_by_episode_with_mcnemar_and_wilson(tmp_path: Path) -> None:
    a = load_episode_run(_run(tmp_path / "a", {0, 1}, profile="a"))
    b = load_episode_run(_run(tmp_path / "b", {1, 2, 3, 4, 5, 6, 7}, profile="b"))
    result = compare_episode_runs(a, b)
    assert result["n"] == 10
    assert result["flips"] == {"fixed": [f"twc-{s}" for s in range(2, 8)], "broken": ["twc-0"]}
    assert result["mcnemar"]["p_value"] == mcnemar_exact(6, 1) == pytest.approx(0.125)
    assert not result["mcnemar"]["significant"]
    assert result["success_delta_pp"] == pytest.approx(50.0)
    assert result["success_delta_episodes"] == 5
    low, high = result["success_delta_ci95_pp"] or (0.0, 0.0)
    assert low < 50.0 < high
    success_b = result["b"]["success"]
    assert (success_b["correct"], success_b["total"]) == (7, 10)
    assert success_b["ci95"] == pytest.approx(list(wilson_interval(7, 10)))
    assert result["a"]["mean_score"] == pytest.approx((2 * 1.0 + 8 * 0.5) / 10)
    assert result["a"]["mean_steps"] == pytest.approx((2 * 3 + 8 * 4) / 10)
    assert result["mean_steps_delta"] == pytest.approx(-0.5)
    assert result["a"]["mean_steps_successful"] == 3.0
    text = format_episode_comparison(result)
    assert "success delta (B - A): +50.00 pp (+5 episodes)" in text
    assert "paired test on success (exact McNemar): 6 fixed, 1 broken, p = 0.125" in text
    assert "broken (succeeded in A, failed in B): 1: twc-0" in text
    assert "\na    2/10 = 20.00%" in text


def test_slices_are_the_tags_that_split_the_episodes_adjusted_as_one_family(
    tmp_path: Path,
) -> None:
    hard = [0, 1, 2, 3, 4]
    a = load_episode_run(_run(tmp_path / "a", set(), hard=hard))
    b = load_episode_run(_run(tmp_path / "b", {0, 1, 2, 3, 4, 5}, profile="b", hard=hard))
    slices = compare_episode_runs(a, b)["slices"]
    assert [row["slice"] for row in slices["rows"]] == ["difficulty:easy", "difficulty:hard"]
    assert "game:twc" in slices["whole_run_tags"] and "fold:test" in slices["whole_run_tags"]
    easy, hard_row = slices["rows"]
    assert (hard_row["fixed"], hard_row["broken"], hard_row["n"]) == (5, 0, 5)
    raw = [mcnemar_exact(1, 0), mcnemar_exact(5, 0)]
    assert [easy["p_value"], hard_row["p_value"]] == raw
    assert [easy["p_adjusted"], hard_row["p_adjusted"]] == adjust_p(raw, "holm")
    assert slices["tests"] == 2 and slices["method"] == "holm"
    chosen = compare_episode_runs(a, b, slices=["game:twc"], method="bh")["slices"]
    assert [r["slice"] for r in chosen["rows"]] == ["game:twc"]
    assert chosen["rows"][0]["n"] == 10 and chosen["controls"].startswith("Benjamini")
    with pytest.raises(CompareError, match="no scenario carries the tag 'nosuch'"):
        compare_episode_runs(a, b, slices=["nosuch"])


def test_an_incomplete_run_is_refused_naming_its_episodes(tmp_path: Path) -> None:
    with pytest.raises(CompareError, match=r"incomplete episode run.*environment error in 1"):
        load_episode_run(_run(tmp_path / "err", {0}, errors=[3]))
    with pytest.raises(CompareError, match=r"2 episode\(s\) not run: 'twc-8', 'twc-9'"):
        load_episode_run(_run(tmp_path / "part", {0}, seeds=range(8)))


def test_different_seeds_or_environments_are_refused(tmp_path: Path) -> None:
    a = load_episode_run(_run(tmp_path / "a", {0}))
    fewer = parse_env_spec({**TABLE, "seeds": "0-8"})
    b = load_episode_run(_run(tmp_path / "b", {0}, spec=fewer, profile="b"))
    with pytest.raises(CompareError, match=r"different episodes \(seeds\): 1 only in A.*'twc-9'"):
        compare_episode_runs(a, b)
    other = parse_env_spec({**TABLE, "params": "numLocations=2,numItemsToPutAway=2"})
    c = load_episode_run(_run(tmp_path / "c", {0}, spec=other, profile="c"))
    with pytest.raises(CompareError, match=r"different environments \(params differ\)"):
        compare_episode_runs(a, c)
    steps = parse_env_spec({**TABLE, "max_steps": 9})
    d = load_episode_run(_run(tmp_path / "d", {0}, spec=steps, profile="d"))
    assert compare_episode_runs(a, d)["notes"] == ["max_steps differs: A 50, B 9"]


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_compares_episode_runs_and_refuses_a_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path / "a", {0, 1})
    b = _run(tmp_path / "b", {1, 2, 3}, profile="b")
    code, out, _ = _cli(capsys, "compare", a, b, "--json")
    data = json.loads(out)
    assert code == 0 and data["kind"] == "episodes" and data["flips"]["broken"] == ["twc-0"]
    code, out, _ = _cli(capsys, "compare", a, b)
    assert code == 0 and out.startswith("A = a (") and "exact McNemar" in out
    scenario = write_run(tmp_path / "s", [make_record("s1", 0, final_match=True)], ckpt="s")
    code, _, err = _cli(capsys, "compare", a, scenario)
    # runs of both kinds are one model's three ways: these are two models, each incomplete
    assert code == 2 and "are 0 teacher-forced, 0 free-running, 1 closed-loop" in err
    code, _, err = _cli(capsys, "compare", a, b, b)
    assert code == 2 and "two at a time" in err
    code, _, err = _cli(capsys, "compare", a, _run(tmp_path / "e", {0}, errors=[2]))
    assert code == 2 and "environment error in 1 episode(s): 'twc-2'" in err


def test_recount_of_an_episode_run_names_the_blocks_that_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "a", {0, 1}, hard=[0])
    code, out, _ = _cli(capsys, "recount", run)
    assert code == 0 and "memeval recount: OK" in out and "10 episode(s), success 2/10" in out
    predictions = run / "predictions.jsonl"
    lines = predictions.read_text("utf-8").splitlines()
    edited = json.loads(lines[0])
    edited.update(success=False, reason="step_limit")
    predictions.write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n", "utf-8")
    code, _, err = _cli(capsys, "recount", run)
    assert code == 1
    assert (
        "differs from the recount of predictions.jsonl in episodes, slices[difficulty:hard]" in err
    )
    predictions.write_text("{oops\n", "utf-8")
    code, _, err = _cli(capsys, "recount", run)
    assert code == 1 and "predictions.jsonl:1: not JSON" in err


def _metrics(run: Path) -> EpisodeRunMetrics:
    metrics: EpisodeRunMetrics = json.loads((run / "metrics.json").read_text("utf-8"))
    return metrics


def test_the_gate_checks_success_exactly_and_never_passes_an_incomplete_run(
    tmp_path: Path,
) -> None:
    half = _metrics(_run(tmp_path / "half", {0, 1, 2, 3, 4}))
    checks = evaluate_episode_gate(EpisodeGateSettings(min_success=Fraction(1, 2)), half)
    assert [(c.passed, c.detail) for c in checks] == [
        (True, "success >= 50.00%: 50.00% (5/10), 0.00 pp above the threshold")
    ]
    base = EpisodeBaseline(Path("runs/ref"), success=(7, 10))
    settings = EpisodeGateSettings(baseline=base, max_drop=Fraction(10))
    [drop] = evaluate_episode_gate(settings, half)
    assert not drop.passed
    assert drop.detail == (
        "success drop vs baseline <= 10.00 pp: 50.00% vs 70.00% in runs/ref: dropped 20.00 pp, "
        "10.00 pp over the limit"
    )
    broken = _metrics(_run(tmp_path / "err", {0, 1, 2, 3, 4, 5}, errors=[7]))
    first, threshold = evaluate_episode_gate(
        EpisodeGateSettings(min_success=Fraction(1, 2)), broken
    )
    assert threshold.passed and not first.passed
    assert "environment error in 1 episode(s): 'twc-7'" in first.detail


IDS = [f"twc-{s}" for s in SPEC.seeds]
ENV = {**SPEC.as_plain(), "version": "1.1.0"}


def test_gate_options_of_a_closed_loop_run(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeini("[pytest]\nmemeval_min_success = 40%\n")
    settings = episode_gate_settings(pytester.parseconfig(), IDS, ENV)
    assert settings.min_success == Fraction(2, 5) and settings.baseline is None
    given = pytester.parseconfig("--memeval-min-success", "0.9")
    assert episode_gate_settings(given, IDS, ENV).min_success == Fraction(9, 10)
    base = _run(tmp_path / "base", {0, 1, 2})
    config = pytester.parseconfig("--memeval-baseline", str(base), "--memeval-max-drop", "5")
    settings = episode_gate_settings(config, IDS, ENV)
    assert settings.baseline == EpisodeBaseline(base, (3, 10))
    assert settings.max_drop == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memeval-min-m1", "0.5"], "gate its success rate with --memeval-min-success RATE"),
        (["--memeval-min-success", "85"], "a rate must lie between 0 and 1"),
        (["--memeval-max-drop", "game:twc=5", "--memeval-baseline", "{base}"], "per-slice"),
        (["--memeval-max-drop", "5"], "needs --memeval-baseline"),
        (["--memeval-baseline", "{scenario}"], "a scenario run; the baseline of a closed-loop"),
        (["--memeval-baseline", "{fewer}"], r"different episodes \(seeds\)"),
        (["--memeval-baseline", "{error}"], "environment error in 1 episode"),
    ],
)
def test_gate_options_a_closed_loop_run_refuses(
    pytester: pytest.Pytester, tmp_path: Path, args: list[str], message: str
) -> None:
    paths = {
        "base": _run(tmp_path / "base", {0}),
        "scenario": write_run(tmp_path / "s", [make_record("s1", 0, final_match=True)], ckpt="s"),
        "fewer": _run(tmp_path / "fewer", {0}, spec=parse_env_spec({**TABLE, "seeds": "0-4"})),
        "error": _run(tmp_path / "error", {0}, errors=[1]),
    }
    config = pytester.parseconfig(*(a.format(**paths) for a in args))
    with pytest.raises(pytest.UsageError, match=message):
        episode_gate_settings(config, IDS, ENV)
