"""Crash safety and ``--memeval-resume``: real faults, kept results, a resume that finishes.

The faults are real: a worker process killed with SIGKILL from inside itself, an exception
raised inside the model call (a decoder wrapping the real one), a KeyboardInterrupt. The
pytester project's conftest triggers them from environment variables, so the resume run is
the same project without the fault. Each resumed run must equal an uninterrupted run of the
same scenarios (counts and predictions, placement fields aside).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.recount import recount_run
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY, Journal
from pytest_memeval.runtime.resume import JOURNAL_FORMAT, header_differences, resume_point

from ..conftest import MemevalProject, demo_records, write_project
from ..faults import FAULTS_CONFTEST
from ..moduleruns import run_pytest
from ..runfactory import content

N = 3
COUNTS = ("n", "m1", "m2", "unaligned", "parse_fail", "m2_by_position", "fingerprints")


def _journal_records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "journal.jsonl").read_text("utf-8").splitlines()
    header = json.loads(lines[0])
    assert header[JOURNAL_HEADER_KEY] == JOURNAL_FORMAT, "the journal starts with its header"
    return [json.loads(line) for line in lines[1:]]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted run of the same scenarios and profile, to compare resumes with.

    Laid out like ``memeval_project`` (same profile table), run once for the module."""
    root = tmp_path_factory.mktemp("clean")
    # The same project as ``memeval_project`` writes (its ``demo`` profile), outside pytester.
    write_project(root, demo_records("oracle", N))
    proc = run_pytest(root, "--ckpt", "demo", "-q")
    assert proc.ret in (0, 1), proc.stdout.str() + proc.stderr.str()
    run_dir = root / "runs" / "demo"
    metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    assert metrics["complete"] is True
    preds = [json.loads(x) for x in (run_dir / "predictions.jsonl").read_text("utf-8").splitlines()]
    return {"metrics": metrics, "predictions": preds}


def _assert_equals_clean(project: MemevalProject, clean: dict[str, Any]) -> None:
    metrics = project.metrics()
    assert metrics["complete"] is True and metrics["missing"] == []
    for key in COUNTS:
        assert metrics[key] == clean["metrics"][key], key
    assert content(project.predictions()) == content(clean["predictions"])
    recount_run(project.run_dir())


@pytest.mark.slow
def test_killed_worker_and_failing_model_call_then_resume(
    memeval_project: MemevalProject, clean_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    records = demo_records("oracle", N)
    ids = [r["id"] for r in records]
    memeval_project.write(records)
    memeval_project.pytester.makeconftest(FAULTS_CONFTEST)
    raise_id, kill_id = ids[0], ids[2]
    monkeypatch.setenv("FAULT_RAISE", raise_id)
    monkeypatch.setenv("FAULT_KILL", kill_id)

    result = memeval_project.run("--ckpt", "demo", "-n", "2")
    assert result.ret != 0
    out = result.stdout.str()
    assert "model call failed on" in out, out  # the exception is reported as an error
    assert f"crashed while running 'test_eval.py::test_final_query[{kill_id}]'" in out, out
    # Unfinished: written beside the top level (which holds no finished run yet).
    partial = memeval_project.latest_subset()
    assert not (memeval_project.run_dir() / "metrics.json").exists()
    metrics = memeval_project.subset_metrics()
    assert metrics["complete"] is False
    assert sorted(metrics["missing"]) == sorted([raise_id, kill_id])
    preds = (partial / "predictions.jsonl").read_text("utf-8").splitlines()
    assert metrics["n"] == 1 and [json.loads(p)["id"] for p in preds] == [ids[1]]
    result.stdout.fnmatch_lines(
        [
            "*ckpt demo: 1 scenarios (INCOMPLETE)*",
            "INCOMPLETE: 2 selected scenario(s) have no result: *",
            "*rerun with --memeval-resume*",
        ]
    )
    kept = _journal_records(partial)
    assert [r["id"] for r in kept] == [ids[1]]
    recount_run(partial)  # even an incomplete run recounts exactly

    monkeypatch.delenv("FAULT_RAISE")
    monkeypatch.delenv("FAULT_KILL")
    resumed = memeval_project.run("--ckpt", "demo", "-n", "2", "--memeval-resume")
    assert resumed.ret in (0, 1), resumed.stdout.str()  # 1 only for wrong answers
    resumed.stdout.fnmatch_lines(
        ["*resumed: 1 scenario(s) taken from the journal, 2 evaluated now"]
    )
    # Only the missing scenarios ran (2 scenarios x 2 items; the workers deselected the rest)
    # and the journal kept its old record, appending the new ones.
    outcomes = resumed.parseoutcomes()
    assert sum(outcomes.get(k, 0) for k in ("passed", "failed", "xfailed", "error")) == 4
    # The resumed run finished: its directory was promoted to the top level.
    again = [r["id"] for r in _journal_records(memeval_project.run_dir())]
    assert again[0] == ids[1] and sorted(again) == sorted(ids)
    assert memeval_project.subsets() == []
    _assert_equals_clean(memeval_project, clean_run)
    assert memeval_project.metrics()["scope"]["resumed"] == 1


@pytest.mark.slow
def test_interrupt_then_resume(
    memeval_project: MemevalProject, clean_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    records = demo_records("oracle", N)
    ids = [r["id"] for r in records]
    memeval_project.write(records)
    memeval_project.pytester.makeconftest(FAULTS_CONFTEST)
    monkeypatch.setenv("FAULT_INTERRUPT", ids[1])

    result = memeval_project.run("--ckpt", "demo")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    metrics = memeval_project.subset_metrics()
    assert metrics["complete"] is False and metrics["missing"] == ids[1:]
    assert [r["id"] for r in _journal_records(memeval_project.latest_subset())] == ids[:1]
    result.stdout.fnmatch_lines(["INCOMPLETE: 2 selected scenario(s) have no result: *"])

    monkeypatch.delenv("FAULT_INTERRUPT")
    resumed = memeval_project.run("--ckpt", "demo", "--memeval-resume")
    assert resumed.ret in (0, 1), resumed.stdout.str()
    _assert_equals_clean(memeval_project, clean_run)

    # A resume of a finished run has nothing left to do, and says so with success.
    done = memeval_project.run("--ckpt", "demo", "--memeval-resume")
    assert done.ret == 0, done.stdout.str()
    done.stdout.fnmatch_lines(
        [f"*resumed: {N} scenario(s) taken from the journal, 0 evaluated now"]
    )
    _assert_equals_clean(memeval_project, clean_run)

    # Changed decoding settings: the journal is refused, naming the difference.
    toml = memeval_project.path / "pyproject.toml"
    toml.write_text(toml.read_text("utf-8").replace("max_new_tokens = 16", "max_new_tokens = 9", 1))
    refused = memeval_project.run("--ckpt", "demo", "--memeval-resume")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        [
            "*--memeval-resume:*journal.jsonl was written for a different run*",
            "*decoding fingerprint*",
        ]
    )
    _assert_equals_clean(memeval_project, clean_run)  # the refused run touched nothing


# -- model-free unit tests of the journal and the resume check ----------------------------


def _header(**fps: str | None) -> dict[str, Any]:
    return {
        JOURNAL_HEADER_KEY: JOURNAL_FORMAT,
        "kind": "model",
        "decode_path": "fast",
        "parse": {"final": None, "turn": None},
        "fingerprints": {"benchmark": "sha256:b", "model": "sha256:m", **fps},
    }


def test_header_differences_name_each_changed_fingerprint() -> None:
    assert header_differences(_header(), _header()) == []
    diffs = header_differences(_header(adapter="sha256:a1"), _header(adapter="sha256:a2"))
    assert diffs == ["adapter fingerprint: journal 'sha256:a1', now 'sha256:a2'"]
    diffs = header_differences(_header(), {**_header(model="sha256:x"), "decode_path": "reference"})
    assert diffs == [
        "model fingerprint: journal 'sha256:m', now 'sha256:x'",
        "decode_path: journal 'fast', now 'reference'",
    ]


def test_journal_recover_drops_only_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.open(truncate=True, header=_header())
    offsets = [journal.append({"id": f"s{i}", "x": i}) for i in range(3)]
    journal.close()
    with journal.path.open("ab") as fh:
        fh.write(b'{"id": "s3", "x"')  # the process died mid-write
    recovered = list(journal.recover())
    assert [(o, r["id"]) for o, r in recovered] == list(
        zip(offsets, ["s0", "s1", "s2"], strict=True)
    )
    assert journal.path.read_bytes().endswith(b'"x": 2}\n'), "the torn tail is truncated"
    assert list(journal.read_at([offsets[1]])) == [{"id": "s1", "x": 1}]
    # A damaged line *followed by* records is not a torn tail: refuse instead of truncating.
    with journal.path.open("ab") as fh:
        fh.write(b"garbage\n" + json.dumps({"id": "s9"}).encode() + b"\n")
    size = journal.path.stat().st_size
    with pytest.raises(ValueError, match=r"journal.jsonl:5: damaged journal line"):
        list(journal.recover())
    assert journal.path.stat().st_size == size


def test_a_journal_without_header_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"id": "s1"}) + "\n", "utf-8")
    from pytest_memeval.runtime.resume import ResumeError

    with pytest.raises(ResumeError, match="has no journal header"):
        resume_point(Journal(path), None)  # type: ignore[arg-type]  # refused before use
