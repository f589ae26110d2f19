"""A finished run as an experiment tracker sees it (tools/publish/tracking/fields.py): parameters,
metrics, tags and artifacts, tracker-neutral; and the JUnit properties built from the same
run (tools/publish/junit.py), through their public functions."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_memeval.core.profiles import BenchmarkSpec, GenerationSettings, Profile
from pytest_memeval.tools.gate import GateCheck, GateOutcome
from pytest_memeval.tools.publish import (
    VALUE_LIMIT,
    FinishedRun,
    add_suite_properties,
    case_properties,
    suite_properties,
)
from pytest_memeval.tools.publish.tracking import (
    GitState,
    git_state,
    run_metrics,
    run_params,
    run_tags,
    slice_metric_name,
    stage_artifacts,
)

from ..runfactory import make_record, seed_runs

PROFILE = Profile(
    name="oracle",
    kind="model",
    benchmark=BenchmarkSpec(path=Path("/data/val.jsonl")),
    source=Path("/proj/pyproject.toml"),
    model=Path("/models/base"),
    adapter=Path("/train/out/checkpoint-500"),
    generation=GenerationSettings(max_new_tokens=16),
)


def _finished(tmp_path: Path, **kw: object) -> FinishedRun:
    _, oracle = seed_runs(tmp_path)
    metrics = json.loads((oracle / "metrics.json").read_text("utf-8"))
    metrics["overrides"] = {"adapter": {"value": "/train/out/checkpoint-500", "profile": "a"}}
    metrics["decoding"] = {"path": "fast", "dtype": "float32", "max_new_tokens": 16}
    metrics["timing"] = {"wall_s": 12.5, "scenarios_per_s": 15.12}
    fields: dict[str, object] = {
        "ckpt": "oracle",
        "run_dir": oracle,
        "run_root": oracle,
        "metrics": metrics,
        "profile": PROFILE,
        "exitstatus": 0,
    }
    fields.update(kw)
    return FinishedRun(**fields)  # type: ignore[arg-type]


def test_params_say_what_was_evaluated_and_how(tmp_path: Path) -> None:
    params = run_params(_finished(tmp_path))
    assert params["ckpt"] == "oracle" and params["kind"] == "model"
    assert params["model"] == "/models/base"
    assert params["adapter"] == "/train/out/checkpoint-500"
    assert params["benchmark"] == "/data/val.jsonl"
    assert params["fingerprint.benchmark"] == "sha256:oracle-b1"
    assert params["decoding.dtype"] == "float32" and params["decoding.path"] == "fast"
    assert params["override.adapter"] == "/train/out/checkpoint-500"
    assert params["n"] == "189"
    assert all(isinstance(v, str) and len(v) <= 500 for v in params.values())


def test_metrics_are_the_rates_their_intervals_and_counts(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    metrics = run_metrics(run.metrics)
    m1 = run.metrics["m1"]
    assert metrics["m1"] == m1["rate"] and (metrics["m1_correct"], metrics["m1_total"]) == (
        169,
        189,
    )
    assert [metrics["m1_ci95_low"], metrics["m1_ci95_high"]] == m1["ci95"]
    assert metrics["m2"] == run.metrics["m2"]["rate"]
    assert metrics["wall_s"] == 12.5 and metrics["n"] == 189
    assert all(isinstance(v, float) for v in metrics.values())


def test_metrics_carry_every_slice_under_a_name_mlflow_accepts(tmp_path: Path) -> None:
    from mlflow.utils.validation import validate_param_and_metric_name

    run = _finished(tmp_path)
    one = run.metrics["m1"]
    block = {"n": 5, "m1": one, "m2": run.metrics["m2"], "unaligned": 0, "m1_mde_pp": None}
    run.metrics["slices"] = {tag: block for tag in ("query:door-state", "a+b", "a_plus_b", "x@y.z")}
    metrics = run_metrics(run.metrics)
    assert metrics["slice/query:door-state/n"] == 5.0
    assert metrics["slice/query:door-state/m1"] == one["rate"]
    assert metrics["slice/query:door-state/m1_ci95_high"] == one["ci95"][1]
    assert metrics["slice/query:door-state/m2_total"] == run.metrics["m2"]["total"]
    names = [slice_metric_name(tag) for tag in run.metrics["slices"]]
    assert len(set(names)) == 4, names
    assert all(validate_param_and_metric_name(name) for name in metrics)


def test_tags_say_how_it_ended_and_where_it_came_from(tmp_path: Path) -> None:
    gate = GateOutcome(checks=[GateCheck("m1", False, "m1 >= 90%: below")])
    run = _finished(tmp_path, gate=gate, exitstatus=1, baseline=tmp_path / "baseline")
    tags = run_tags(run, GitState("0123abcd", dirty=True))
    assert tags["memeval.complete"] == "true" and tags["memeval.gate"] == "failed"
    assert tags["memeval.exitstatus"] == "1"
    assert tags["memeval.baseline"] == str(tmp_path / "baseline")
    assert (tags["git.commit"], tags["git.dirty"]) == ("0123abcd", "true")
    assert run_tags(_finished(tmp_path / "b"), GitState(None, None))["memeval.gate"] == "none"


def test_git_state_of_a_checkout_and_of_a_plain_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f.txt").write_text("a", "utf-8")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert git_state(repo) == GitState(head.strip(), dirty=False)
    (repo / "f.txt").write_text("b", "utf-8")
    assert git_state(repo) == GitState(head.strip(), dirty=True)
    # Not a checkout: the commit a CI variable names, if any.
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILD_VCS_NUMBER", "GIT_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    assert git_state(plain) == GitState(None, None)
    monkeypatch.setenv("CI_COMMIT_SHA", "feedbeef")
    assert git_state(plain) == GitState("feedbeef", None)


def test_artifacts_are_the_run_files_the_report_and_the_summary(tmp_path: Path) -> None:
    baseline, _ = seed_runs(tmp_path / "seed")
    run = _finished(tmp_path, baseline=baseline)
    html = tmp_path / "pytest-report.html"
    html.write_text("<html>pytest-html</html>", "utf-8")
    run = _finished(tmp_path / "other", baseline=baseline, html_report=html)
    staging = tmp_path / "staging"
    staging.mkdir()
    names = stage_artifacts(run, staging)
    assert names == [
        "run/metrics.json",
        "run/predictions.jsonl",
        "report.html",
        "summary.md",
        "pytest-html/pytest-report.html",
    ]
    assert (staging / "run" / "metrics.json").read_bytes() == (
        run.run_dir / "metrics.json"
    ).read_bytes()
    page = (staging / "report.html").read_text("utf-8")
    assert "memeval report: baseline vs oracle" in page  # against the gate's baseline
    assert "## memeval: `oracle`" in (staging / "summary.md").read_text("utf-8")


# -- JUnit properties of the same run -----------------------------------------------------------


def test_testcase_properties_of_each_item_kind() -> None:
    final = make_record("s1", 0, final_match=False, final_pred="x" * (VALUE_LIMIT + 5))
    props = dict(case_properties("test_final_query", final))
    assert props["memeval.scenario"] == "s1" and props["memeval.truth"] == "sink"
    assert props["memeval.prediction"] == "x" * VALUE_LIMIT + "… (+5 characters)"
    assert props["memeval.match"] == "false"
    turns = make_record("s2", 1, final_match=True, turn_matches=[True, False])
    assert case_properties("test_turns", turns) == [
        ("memeval.scenario", "s2"),
        ("memeval.turns", "1/2"),
        ("memeval.turn", "1"),
        ("memeval.prediction", "look around"),
        ("memeval.truth", "place mug in sink"),
    ]
    unaligned = make_record("s3", 2, final_match=True, chain=["a"])
    assert dict(case_properties("test_turns", unaligned))["memeval.turns"] == (
        "unaligned: 2 turns, not scored"
    )
    failed = make_record("s4", 3, final_match=False, final_pred="", parse_fail=True)
    assert dict(case_properties("test_final_query", failed))["memeval.parse_fail"] == "empty"


def test_suite_properties_go_first_into_the_file_pytest_wrote(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" tests="1"><testcase classname="t" name="a" time="0.1"/>'
        "</testsuite></testsuites>",
        "utf-8",
    )
    gate = GateOutcome(
        checks=[GateCheck("m1", True, "fine"), GateCheck("m2", False, "m2 below\x00(a NUL)")]
    )
    run = _finished(tmp_path, gate=gate)
    assert add_suite_properties(path, suite_properties(run)) == 1
    text = path.read_text("utf-8")
    assert text.startswith('<?xml version="1.0" encoding="utf-8"?><testsuites')
    suite = ET.fromstring(text).find("testsuite")
    assert suite is not None and [child.tag for child in suite] == ["properties", "testcase"]
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["memeval.m1.correct"] == "169" and props["memeval.gate"] == "failed"
    assert props["memeval.gate.failed"] == "m2 below\ufffd(a NUL)"  # XML cannot hold a NUL
    assert props["memeval.complete"] == "true" and props["memeval.ckpt"] == "oracle"
    # A run the user recorded properties for already keeps them, ours after.
    path.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="p">'
        '<properties><property name="ARCH" value="PPC"/></properties></testsuite></testsuites>',
        "utf-8",
    )
    add_suite_properties(path, [("memeval.n", "4")])
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert [p.get("name") for p in suite.iter("property")] == ["ARCH", "memeval.n"]


def test_the_history_is_a_parameter_and_departures_are_metrics(tmp_path: Path) -> None:
    """A checkpoint's teacher-forced and free-running runs are two series for a tracker
    (and for JUnit's ingesters): the history says which; where the scenarios left the truth
    is logged as metrics."""
    truth = _finished(tmp_path / "t")
    assert run_params(truth)["history"] == "truth"  # metrics without the field: teacher-forced
    free = _finished(tmp_path / "f")
    free.metrics["history"] = "model"
    free.metrics["left_truth"] = {
        "at": {"0": 3, "4": 1},
        "never": 185,
        "still_right": {"correct": 6, "total": 8},
    }
    assert run_params(free)["history"] == "model"
    metrics = run_metrics(free.metrics)
    assert metrics["left_truth_scenarios"] == 4.0 and metrics["left_truth_never"] == 185.0
    assert metrics["still_right_after"] == 0.75
    assert metrics["still_right_after_correct"] == 6.0 and metrics["still_right_after_total"] == 8.0
    # Records written before the facts existed (these) count in neither.
    assert run_metrics(truth.metrics)["left_truth_scenarios"] == 0.0
    assert ("memeval.history", "model") in suite_properties(free)
    assert ("memeval.history", "truth") in suite_properties(truth)
