"""``memeval gpu-check``'s reading of its steps and its report (tools/gpu_check/report.py),
on outputs as ``memeval bench`` prints them: the figures, the statuses (finished, differs,
failed, cut, skipped, absent) and the Markdown, without running a step."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_memeval.tools.gpu_check import (
    Report,
    Step,
    StepResult,
    bench_facts,
    read_pytest_run,
    render,
    step_result,
)

#: The end of a real `memeval bench --dtype bfloat16 -n 3 --turns ''` output on the demo.
BENCH = """\
memeval bench: profile oracle, 3 scenarios, 32 assistant turns, 462 tokens; bfloat16, eager attention
reference:    26.75 s      0.11 scenarios/s
fast:         16.84 s      0.18 scenarios/s  (batch 1, margin in ulps of the top logit, below)
  turns: 22 teacher-forced, 10 generated (10 not the truth)
  handed to the reference call: 0 of 32 turns (0.0%)
  exact mode: off: linear weight 256x16 float32 on cpu: two rows at once do not give the bits
  logit disagreement with the reference computation, max |delta| per position:
    first answer token (forward pass vs generate's prefill): max 0 (0 ulp), p99 0 (0 ulp) over 12 positions; bound 1.5 ulp of the top logit
    exact steps from the forward pass's cache vs the reference call: not measured; bound 3 ulp of the top logit
  seconds: 0.02 building prompts (shared with the reference path), 2.41 forward passes
calibration: measured now, 13.96 s (12 turns), stored in /tmp/cache/calibration/x.json
fast without calibration:     2.88 s  (9.3x the reference)
floor:         0.78 s  one forward pass over every scenario's conversation (no generation); fast path 21.5x the floor (3.7x without the calibration)
fast/reference speedup: 1.6x, predictions identical: yes
"""  # noqa: E501

BENCH_STEP = Step("bench oracle bfloat16", "bench", ["python", "-m", "pytest_memeval", "bench"])
PYTEST_STEP = Step("pytest --ckpt oracle -n 2", "pytest", ["python", "-m", "pytest"])


def test_bench_figures_are_read_off_its_lines() -> None:
    facts = bench_facts(BENCH)
    assert (facts.speedup, facts.identical) == ("1.6", "yes")
    assert (facts.reference_s, facts.fast_s) == ("26.75", "16.84")
    assert (facts.floor_s, facts.fast_over_floor) == ("0.78", "21.5")
    assert facts.exact_mode is not None and facts.exact_mode.startswith("off: linear weight")
    # The exact stage's and the calibration's lines, in the order bench printed them.
    assert [line.split(" ")[0] for line in facts.exact_lines] == [
        "handed",
        "exact",
        "first",
        "exact",
        "calibration:",
        "fast",
    ]
    cut = bench_facts(BENCH.split("fast:")[0])
    assert cut.reference_s == "26.75" and cut.speedup is cut.floor_s is cut.identical is None


def test_statuses_from_exit_status_output_and_time_limit() -> None:
    def status(step: Step, out: str, code: int | None, timed_out: bool = False) -> str:
        result = step_result(step, out, code, 1.0, timed_out, 200.0, None)
        return result.status + (f" ({result.note})" if result.note else "")

    assert status(BENCH_STEP, BENCH, 0) == "ok"
    differs = BENCH.replace("identical: yes", "identical: no")
    assert status(BENCH_STEP, differs, 1) == "differs"
    assert (
        status(BENCH_STEP, "memeval bench: error: no such profile", 2) == "failed (exit status 2)"
    )
    assert status(BENCH_STEP, BENCH.split("fast:")[0], -9, True) == "timed out (cut at 200 s)"
    # A pytest run's failed items are the model's wrong answers: exit 1 with a run is fine;
    # without the run it read nothing.
    assert status(PYTEST_STEP, "", 1) == "failed (exit status 1)"


def _pytest_run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    records = [
        {"id": "s1", "worker": "gw0", "device": "cuda:0 (physical 0)", "decode_batch": 2},
        {"id": "s2", "worker": "gw0", "device": "cuda:0 (physical 0)", "decode_batch": 2},
        {"id": "s3", "worker": "gw1", "device": "cuda:0 (physical 1)", "decode_batch": 1},
    ]
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    timing = {"scenarios_per_s": 3.0, "wall_s": 1.0, "mean_batch": 1.667, "batch_size": 16}
    (run / "metrics.json").write_text(json.dumps({"n": 3, "timing": timing}))
    return run


def test_the_report_says_what_ran_how_and_why_not(tmp_path: Path) -> None:
    run = read_pytest_run(_pytest_run_dir(tmp_path))
    assert run is not None and run.n == 3
    assert run.bindings == {("gw0", "cuda:0 (physical 0)"): 2, ("gw1", "cuda:0 (physical 1)"): 1}
    assert read_pytest_run(tmp_path / "nothing") is None
    header = "memeval: workers: gw0 -> cuda:0 (physical 0), gw1 -> cuda:0 (physical 1)\n"
    report = Report("cuda", "memeval gpu-check --device cuda", 570, 2, ("0", "1"))
    report.results = [
        step_result(BENCH_STEP, BENCH, 0, 12.5, False, 200, None),
        step_result(
            PYTEST_STEP, header + "= 3 failed, 3 passed in 9.1s =\n", 1, 20.0, False, 200, run
        ),
        StepResult(Step("bench smol-oracle", "bench", None), "absent", 0, "", "the file is absent"),
    ]
    report.seconds = 40
    assert not report.ok  # still running
    report.done = True
    assert report.ok  # an absent step does not count against it
    text = render(report)
    assert (
        "| bench oracle bfloat16 | ok | 12.5 | 1.6x | yes | 26.75 | 16.84 | 0.78 | 21.5x |" in text
    )
    assert "- bench smol-oracle: absent (the file is absent)" in text
    assert "- float32: accelerator: up to 16 scenarios a pass, no fill rule" in text
    assert "| gw1 | cuda:0 (physical 1) | 1 |" in text
    assert "mean batch 1.667 of 16" in text
    assert header.strip() in text
    assert "finished after 40 s of 570 s; every step ran, predictions identical" in text
    report.results.append(StepResult(Step("pytest", "pytest", []), "skipped", 0, "", "no time"))
    assert not report.ok and "NOT all ok" in render(report)
