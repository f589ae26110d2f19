"""``--memeval-history model`` in real pytest runs: the option (with a space and with ``=``)
and the ini key, the run directory beside the teacher-forced one, what the records and
metrics say, the summary's curve beside the teacher-forced run, ``memeval compare`` and
``report`` pairing the two, and every refusal to mix the histories (replay, resume, the
gate's baseline, a decoder of the other history).

Most runs replay crafted predictions (no model: seconds each), with and without xdist; one
evaluates the demo checkpoint free-running with ``-n 0`` and ``-n 2`` and checks the records
of the two agree, and the decoder's outputs against a plain per-turn loop written here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.recount import recount_run
from pytest_memeval.tools.cli import main

from ..conftest import MemevalProject, demo_records
from ..plainloop import plain_free_running, record_outputs
from ..runfactory import (
    content,
    make_record,
    read_jsonl,
    with_history,
    write_crafted,
    write_run,
)

# The -n 2 variants are slow-marked: the inner loop keeps the serial ones.
XDIST = pytest.mark.parametrize(
    "xdist",
    [pytest.param((), id="serial"), pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.slow)],
)


def _crafted(project: MemevalProject, n: int = 4) -> list[dict[str, Any]]:
    """A replay project whose predictions are the truth except the first turn of the first
    two scenarios (so those left the truth at turn 0) and the final answer of the first."""
    recs = demo_records("baseline", n)
    ids = [r["id"] for r in recs]
    write_crafted(project, recs, wrong_final=ids[:1], wrong_turn=ids[:2])
    return recs


@pytest.mark.slow
@XDIST
def test_free_running_run_goes_beside_the_teacher_forced_one(
    memeval_project: MemevalProject, xdist: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    recs = _crafted(memeval_project)
    truth = memeval_project.run("--ckpt", "crafted", *xdist)
    assert truth.ret == 1, truth.stdout.str()  # one wrong final answer, two wrong turns
    # The option written with a space (and, below, with "=").
    free = memeval_project.run("--ckpt", "crafted", "--memeval-history", "model", *xdist)
    assert free.ret == 1, free.stdout.str()
    top, beside = (
        memeval_project.run_dir("crafted"),
        memeval_project.run_dir("crafted@history-model"),
    )
    free.stdout.fnmatch_lines(
        [
            "memeval: ckpt crafted (replay), 4 scenarios from *, decode replay, history model "
            "(free-running: each turn's prompt holds the model's own earlier turns)",
            f"memeval: run directory {beside}",
            "history: model (free-running: *",
            "2/4 scenarios left the truth at some turn (first departure at turn 0, median); of "
            "the turns after it, * were still right *",
            f"teacher-forced run of this checkpoint: {top}",
            "m2 by turn position (aligned scenarios) and where the model first left the truth:",
            "  turn * m2 free-running * m2 teacher-forced * first left the truth",
            "  never * 2",
            f"run directory: {beside}",
        ]
    )
    metrics = memeval_project.metrics("crafted@history-model")
    assert metrics["history"] == "model" and metrics["complete"] is True
    assert memeval_project.metrics("crafted")["history"] == "truth"
    assert metrics["left_truth"]["at"] == {"0": 2} and metrics["left_truth"]["never"] == 2
    records = memeval_project.predictions("crafted@history-model")
    assert {r["history"] for r in records} == {"model"}
    assert [r["left_truth_at"] for r in records] == [0, 0, None, None]
    recount_run(beside)

    # The two histories of one checkpoint: a paired comparison.
    capsys.readouterr()  # pytester's own lines
    assert main(["compare", str(top), str(beside), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["history"]["derailed"] == [] and result["history"]["m1_gap_pp"] == 0
    assert result["b"]["label"] == "crafted (free-running)"
    assert main(["compare", str(top), str(beside)]) == 0
    assert "teacher-forced vs free-running, the same checkpoint" in capsys.readouterr().out
    page = memeval_project.path / "report.html"
    assert main(["report", str(beside), "-o", str(page)]) == 0
    html = page.read_text("utf-8")
    assert "first turn that left the truth" in html and "Teacher-forced and free-running" in html
    assert html.count('data-run="crafted (teacher-forced)"') == 1  # its curve beside

    # The "=" spelling into the same directory: the earlier run moves to previous/, and the
    # records are the same whichever way the run was spelt (or scheduled).
    again = memeval_project.run("--ckpt", "crafted", "--memeval-history=model", *xdist)
    assert again.ret == 1
    assert content(read_jsonl(beside / "predictions.jsonl")) == content(
        read_jsonl(beside / "previous" / "predictions.jsonl")
    )
    assert [r["id"] for r in records] == [r["id"] for r in recs]


@pytest.mark.slow
def test_ini_key_and_bad_values(memeval_project: MemevalProject) -> None:
    _crafted(memeval_project, n=2)
    toml = memeval_project.path / "pyproject.toml"
    base = toml.read_text("utf-8")
    toml.write_text(
        base.replace(
            "[tool.memeval.ckpt.demo]", 'memeval_history = "model"\n\n[tool.memeval.ckpt.demo]'
        ),
        "utf-8",
    )
    listed = memeval_project.run("--ckpt", "crafted", "--collect-only")
    assert listed.ret == 0, listed.stdout.str()
    listed.stdout.fnmatch_lines(
        [f"memeval: run directory {memeval_project.run_dir('crafted')}@history-model"]
    )
    # The option wins over the ini key.
    truth = memeval_project.run("--ckpt", "crafted", "--collect-only", "--memeval-history=truth")
    truth.stdout.fnmatch_lines([f"memeval: run directory {memeval_project.run_dir('crafted')}"])
    toml.write_text(
        base.replace(
            "[tool.memeval.ckpt.demo]", 'memeval_history = "own"\n\n[tool.memeval.ckpt.demo]'
        ),
        "utf-8",
    )
    bad = memeval_project.run("--ckpt", "crafted", "--collect-only")
    assert bad.ret == 4
    bad.stderr.fnmatch_lines(["*memeval_history must be one of truth, model*got 'own'*"])
    toml.write_text(base, "utf-8")
    wrong = memeval_project.run("--ckpt", "crafted", "--memeval-history", "own")
    assert wrong.ret == 4
    wrong.stderr.fnmatch_lines(["*--memeval-history: invalid choice: 'own'*"])


@pytest.mark.slow
@XDIST
def test_replay_of_free_running_predictions_needs_the_history_said(
    memeval_project: MemevalProject, xdist: tuple[str, ...]
) -> None:
    """Our own free-running run replayed: refused as teacher-forced, accepted as
    free-running (into runs/<name>@history-model), whatever xdist does."""
    _crafted(memeval_project)
    assert memeval_project.run("--ckpt", "crafted", "--memeval-history", "model").ret == 1
    source = memeval_project.run_dir("crafted@history-model")
    toml = memeval_project.path / "pyproject.toml"
    toml.write_text(
        toml.read_text("utf-8").replace(
            'predictions = "runs/demo/predictions.jsonl"',
            f'predictions = "{(source / "predictions.jsonl").as_posix()}"',
        ),
        "utf-8",
    )
    refused = memeval_project.run("--ckpt", "replay", *xdist)
    assert refused.ret == 4
    refused.stderr.fnmatch_lines(
        [
            f"*cannot replay {source / 'predictions.jsonl'}: its predictions were made "
            f"free-running (history model: {source / 'metrics.json'} says so), and this run is "
            "teacher-forced (--memeval-history truth)*Replay them with --memeval-history model*"
        ]
    )
    assert not memeval_project.run_dir("replay").exists()
    replayed = memeval_project.run("--ckpt", "replay", "--memeval-history", "model", *xdist)
    assert replayed.ret == 1, replayed.stdout.str()
    again = memeval_project.predictions("replay@history-model")
    assert [r["turns"] for r in again] == [
        r["turns"] for r in read_jsonl(source / "predictions.jsonl")
    ]
    assert memeval_project.metrics("replay@history-model")["history"] == "model"


@pytest.mark.slow
def test_resume_refuses_a_journal_of_the_other_history(memeval_project: MemevalProject) -> None:
    recs = _crafted(memeval_project)
    out = memeval_project.path / "one-dir"
    partial = memeval_project.run("--ckpt", "crafted", f"--memeval-out={out}", "-k", recs[0]["id"])
    assert partial.ret == 1, partial.stdout.str()
    resumed = memeval_project.run(
        "--ckpt",
        "crafted",
        f"--memeval-out={out}",
        "--memeval-resume",
        "--memeval-history",
        "model",
    )
    assert resumed.ret == 4
    resumed.stderr.fnmatch_lines(
        [
            "*refusing to mix results:*",
            "*history: journal truth (teacher-forced: *), now model (free-running: *)*",
        ]
    )


@pytest.mark.slow
def test_gate_baseline_of_the_other_history_is_refused(memeval_project: MemevalProject) -> None:
    recs = _crafted(memeval_project, n=2)
    free = write_run(
        memeval_project.path / "free",
        [
            with_history(make_record(r["id"], i, final_match=True), "model")
            for i, r in enumerate(recs)
        ],
        ckpt="crafted",
        history="model",
    )
    gated = memeval_project.run(
        "--ckpt", "crafted", "--memeval-baseline", str(free), "--memeval-max-drop", "1"
    )
    assert gated.ret == 4
    gated.stderr.fnmatch_lines(
        [
            f"*--memeval-baseline {free}: the baseline is free-running (history model) and this "
            "run teacher-forced (--memeval-history truth)*"
        ]
    )
    assert not memeval_project.run_dir("crafted").exists()


WRONG_HISTORY_DECODER = """
from pytest_memeval.core.records import Rollout, TurnOutput


class TeacherForcedOnly:
    path = "custom"

    def rollout(self, scenario):
        texts = [scenario.messages[k]["content"] for k in scenario.assistant_indices]
        return Rollout(tuple(TurnOutput(t, True) for t in texts), self.path)

    def prefetch(self, scenarios):
        pass


def pytest_memeval_make_decoder(config, profile, path, device):
    return TeacherForcedOnly()
"""


@pytest.mark.slow
@XDIST
def test_a_decoder_that_ignores_the_history_is_caught(
    memeval_project: MemevalProject, xdist: tuple[str, ...]
) -> None:
    _crafted(memeval_project, n=2)
    (memeval_project.path / "conftest.py").write_text(WRONG_HISTORY_DECODER, "utf-8")
    result = memeval_project.run("--ckpt", "crafted", "--memeval-history", "model", *xdist)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            "*HistoryMismatch: scenario 's0001': the decoder (TeacherForcedOnly, from "
            "pytest_memeval_make_decoder) decoded it teacher-forced (history truth), but this "
            "run is free-running*"
        ]
    )
    # Nothing of either history was passed off as the other: no record reached the run.
    metrics = (
        memeval_project.metrics("crafted@history-model")
        if (memeval_project.run_dir("crafted@history-model") / "metrics.json").is_file()
        else None
    )
    assert metrics is None or metrics["n"] == 0


# -- the demo checkpoint, free-running, serial and under xdist ------------------------------


@pytest.mark.slow
def test_demo_free_running_serial_and_xdist_agree(memeval_project: MemevalProject) -> None:
    """The demo's oracle adapter, free-running, with -n 0 and -n 2: the same records (the
    fast path's, with no fallback note), and each output is a plain greedy generate on the
    chat template's rendering of the model's own earlier outputs (the loop below, written
    without the plugin's prompt code)."""
    memeval_project.write(variant="oracle", n=3)
    serial = memeval_project.run("--ckpt", "demo", "--memeval-history", "model")
    assert serial.ret in (0, 1), serial.stdout.str()
    first = memeval_project.predictions("demo@history-model")
    xdist = memeval_project.run("--ckpt", "demo", "--memeval-history=model", "-n", "2")
    assert xdist.ret == serial.ret, xdist.stdout.str()
    second = memeval_project.predictions("demo@history-model")
    assert content(first) == content(second)
    assert all(r["decode"] == "fast" and "notes" not in r for r in second)
    recount_run(memeval_project.run_dir("demo@history-model"))
    _check_against_a_plain_loop(memeval_project.path / "bench.jsonl", second)


def _check_against_a_plain_loop(bench: Path, records: list[dict[str, Any]]) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..conftest import ADAPTERS, BASE_MODEL

    tokenizer = AutoTokenizer.from_pretrained(BASE_MODEL)
    model = AutoModelForCausalLM.from_pretrained(BASE_MODEL, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, ADAPTERS / "oracle").eval()
    scenarios = [json.loads(line) for line in bench.read_text("utf-8").splitlines()]
    for scenario, record in zip(scenarios, records, strict=True):
        expected = plain_free_running(model, tokenizer, scenario["messages"], 16)
        assert record_outputs(record) == expected, record["id"]
