"""``--memeval-resume`` over a journal whose record line is JSON but not a whole record.

A real run of the demo model is interrupted (KeyboardInterrupt before its last scenario), one
journal line is edited by hand to drop a field, and the resume must refuse with one usage
error naming the journal file, line, scenario and field, writing nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import MemevalProject, demo_records
from ..faults import FAULTS_CONFTEST


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_resume_refuses_a_journal_record_missing_a_field(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = demo_records("oracle", 3)
    memeval_project.write(records)
    memeval_project.pytester.makeconftest(FAULTS_CONFTEST)
    monkeypatch.setenv("FAULT_INTERRUPT", records[2]["id"])
    first = memeval_project.run("--ckpt", "demo")
    assert first.ret == pytest.ExitCode.INTERRUPTED, first.stdout.str()
    partial = memeval_project.latest_subset()
    journal = partial / "journal.jsonl"
    lines = journal.read_text("utf-8").splitlines(keepends=True)
    assert len(lines) >= 2, "the interrupted run journaled at least one record"
    damaged = json.loads(lines[1])
    # line 2: the first record, now without final_match
    assert isinstance(damaged.pop("final_match"), bool)
    sid = damaged["id"]
    lines[1] = json.dumps(damaged) + "\n"
    journal.write_text("".join(lines), "utf-8")
    before = _snapshot(memeval_project.run_dir())

    monkeypatch.delenv("FAULT_INTERRUPT")
    # Without xdist and with -n 2 (option spelled with '='): the same refusal, nothing written.
    for args in (["--ckpt", "demo"], ["--ckpt=demo", "-n", "2"]):
        resumed = memeval_project.run(*args, "--memeval-resume")
        assert resumed.ret == pytest.ExitCode.USAGE_ERROR, resumed.stdout.str()
        err = resumed.stderr.str()
        assert "INTERNALERROR" not in err + resumed.stdout.str()
        assert "KeyError" not in err + resumed.stdout.str()
        assert f"{journal}:2: scenario {sid!r}: missing field 'final_match'" in err, err
        assert err.count("damaged journal record") == 1, err
        # Nothing written: the run directory is byte for byte what the interrupted run left.
        assert _snapshot(memeval_project.run_dir()) == before
        assert not (memeval_project.run_dir() / "metrics.json").exists()
