"""``memeval slurm``: the generated scripts, a task's verdict, reading Slurm's answers.

Focused tests without a cluster; ``test_slurm_cluster.py`` runs the same commands against a
real one-node Slurm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.tools.cli import main
from pytest_memeval.tools.slurm import (
    INCOMPLETE_EXIT,
    JobInfo,
    Plan,
    SlurmError,
    SlurmSettings,
    array_tasks,
    check_shard,
    dependency,
    load_settings,
    merge_script,
    parse_scontrol,
    shard_script,
    shard_states,
    task_info,
)

from ..episodefactory import records as episode_records
from ..episodefactory import write_episode_run
from ..runfactory import SHARD_IDS as IDS
from ..runfactory import write_shard

# Lines as `scontrol -o show job` prints them (Slurm 22.05), cut to the fields that matter.
PENDING_ARRAY = (
    "JobId=7 ArrayJobId=7 ArrayTaskId=2-3 JobName=memeval-demo UserId=root(0) "
    "JobState=PENDING Reason=Resources Dependency=(null) ExitCode=0:0 NodeList= "
    "Command=/srv/my runs/slurm/shards.sbatch WorkDir=/srv/my project"
)
RUNNING_TASK = (
    "JobId=8 ArrayJobId=7 ArrayTaskId=1 JobName=memeval-demo JobState=RUNNING Reason=None "
    "ExitCode=0:0 NodeList=node01"
)
FAILED_TASK = (
    "JobId=9 ArrayJobId=7 ArrayTaskId=2 JobName=memeval-demo JobState=FAILED "
    "Reason=NonZeroExitCode ExitCode=137:0 NodeList=node02"
)
CANCELLED_MERGE = (
    "JobId=10 JobName=memeval-demo-merge JobState=CANCELLED Reason=DependencyNeverSatisfied "
    "Dependency=afterok:7_*(failed) ExitCode=0:0 KillOInInvalidDependent=Yes"
)


def plan(tmp_path: Path, *, gpus: int = 0, **settings: Any) -> Plan:
    return Plan(
        ckpt="demo",
        shards=3,
        gpus_per_shard=gpus,
        out=tmp_path / "my runs" / "demo",
        project=tmp_path,
        python=sys.executable,
        settings=SlurmSettings(**settings),
    )


# -- scripts ------------------------------------------------------------------------------


def test_shard_script_on_gpus(tmp_path: Path) -> None:
    p = plan(
        tmp_path, gpus=4, partition="gpu", time="02:00:00", sbatch_args=("--cpus-per-task=32",)
    )
    script = shard_script(p)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=memeval-demo",
        "#SBATCH --array=1-3",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --gpus-per-node=4",
        f'#SBATCH --output="{p.out}/slurm/logs/shard-%a-of-3.job-%A.log"',
        "#SBATCH --partition=gpu",
        "#SBATCH --time=02:00:00",
        "#SBATCH --cpus-per-task=32",
    ]
    # One xdist worker per allocated GPU; the run directory with '=' (paths with spaces).
    assert '-m pytest -n 4 --ckpt=demo --memeval-shard="$K/$N"' in script
    assert '--memeval-out="$SHARD_DIR" $RESUME' in script
    assert f"OUT='{p.out}'" in script  # shell-quoted: the path has a space
    assert "--memeval-gpus" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_shard_script_on_cpu_and_merge_script(tmp_path: Path) -> None:
    p = plan(tmp_path, account="proj1")
    script = shard_script(p)
    assert "--gpus-per-node" not in script
    assert "-m pytest --memeval-gpus=cpu --ckpt=demo" in script  # no -n, no login-node GPUs
    merge = merge_script(p)
    assert "#SBATCH --kill-on-invalid-dep=yes" in merge
    assert "#SBATCH --account=proj1" in merge
    assert "--dependency" not in merge  # given at submission, when the array's id is known
    shards = [f"'{p.out}/shard-{k}-of-3'" for k in (1, 2, 3)]
    assert all(s in merge for s in shards)
    assert f"-o '{p.out}'" in merge
    subprocess.run(["bash", "-n"], input=merge, text=True, check=True)


def test_plan_round_trip_keeps_the_history(tmp_path: Path) -> None:
    free = dataclasses.replace(plan(tmp_path), history="model")
    assert Plan.from_dict(free.as_dict()) == free
    old = {k: v for k, v in plan(tmp_path).as_dict().items() if k != "history"}
    assert Plan.from_dict(old).history == "truth"  # submitted before histories existed


def test_dependency() -> None:
    assert dependency("7") == "afterok:7"
    assert dependency("12", ["7_1", "7_3"]) == "afterok:12:7_1:7_3"
    assert dependency(None, ["7_3"]) == "afterok:7_3"
    assert dependency(None) is None


STUB = """\
#!/bin/bash
# Stands in for python: records the pytest arguments, exits with $STUB_RC; check-shard is
# the real one.
if [ "$2" = pytest ]; then echo "$@" >> "$STUB_LOG"; exit "$STUB_RC"; fi
exec {python} "$@"
"""


@pytest.mark.parametrize(
    ("pytest_rc", "finished", "task_rc"),
    [(1, True, 0), (0, True, 0), (1, False, INCOMPLETE_EXIT), (137, False, 137), (2, True, 2)],
)
def test_shard_script_exit_status(
    tmp_path: Path, pytest_rc: int, finished: bool, task_rc: int
) -> None:
    """The script's own logic, run by bash: pytest's status -> the task's status."""
    stub = tmp_path / "python"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    p = Plan(
        ckpt="demo", shards=3, gpus_per_shard=0, out=tmp_path / "out", project=tmp_path,
        python=str(stub),
    )  # fmt: skip
    if finished:
        write_shard(p.shard_dir(2), IDS, 2, 3)
    env = {
        **os.environ,
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_JOB_ID": "7",
        "STUB_RC": str(pytest_rc),
        "STUB_LOG": str(tmp_path / "calls"),
    }
    done = subprocess.run(["bash", "-c", shard_script(p)], env=env, capture_output=True, text=True)
    assert done.returncode == task_rc, done.stdout + done.stderr
    call = (tmp_path / "calls").read_text()
    assert f"--memeval-shard=2/3 --memeval-out={p.out}/shard-2-of-3" in call
    assert "--memeval-resume" not in call


def test_an_episode_profile_s_scripts_check_its_shards_and_merge_them(tmp_path: Path) -> None:
    """The generated scripts, run by bash, on closed-loop shards (written by the episode
    controller's finalize_episode_run): check-shard's verdict per task, and the merge job's
    real ``memeval merge`` into the submission's directory."""
    stub = tmp_path / "python"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    p = Plan("twc", 2, 0, tmp_path / "out", tmp_path, str(stub))
    env = {**os.environ, "SLURM_ARRAY_JOB_ID": "7", "STUB_RC": "1", "STUB_LOG": str(tmp_path / "c")}
    errors = episode_records(errors=(4,))
    write_episode_run(p.shard_dir(1), shard=(1, 2))
    write_episode_run(p.shard_dir(2), shard=(2, 2), held=errors)

    def task(k: int) -> subprocess.CompletedProcess[str]:
        env["SLURM_ARRAY_TASK_ID"] = str(k)
        return subprocess.run(
            ["bash", "-c", shard_script(p)], env=env, capture_output=True, text=True
        )

    done = task(1)
    assert done.returncode == 0 and "shard 1/2 finished: 3 episode(s)" in done.stdout, done.stderr
    failed = task(2)  # an environment error: the task fails, the merge job never runs
    assert failed.returncode == INCOMPLETE_EXIT and "environment error" in failed.stderr
    write_episode_run(p.shard_dir(2), shard=(2, 2))  # rerun, finished
    assert task(2).returncode == 0
    merge = subprocess.run(["bash", "-c", merge_script(p)], env=env, capture_output=True, text=True)
    assert merge.returncode == 0 and "OK 2 episode shards" in merge.stdout, merge.stderr
    merged = json.loads((p.out / "metrics.json").read_text())
    assert merged["complete"] and merged["kind"] == "episodes"
    assert [m["shard"] for m in merged["merged_from"]] == ["1/2", "2/2"]


def unfinished(run_dir: Path, stamp: str = "20261201T160000Z", done: int = 0) -> Path:
    """An unfinished run as the controller leaves it (runlayout.py): a journal, with a header
    and ``done`` records, in ``subsets/<UTC start time>/``, no metrics."""
    stage = run_dir / "subsets" / stamp
    stage.mkdir(parents=True)
    lines = ['{"memeval_journal": 1}'] + [json.dumps({"id": IDS[i]}) for i in range(done)]
    (stage / "journal.jsonl").write_text("".join(line + "\n" for line in lines))
    return stage


@pytest.mark.slow
def test_shard_script_resumes_when_resubmitted(tmp_path: Path) -> None:
    stub = tmp_path / "python"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    p = Plan("demo", 3, 0, tmp_path / "out", tmp_path, str(stub))
    (tmp_path / "script").write_text(shard_script(p))
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "3", "STUB_RC": "3"}

    def calls(*args: str, **extra: str) -> str:
        log = tmp_path / f"calls{len(list(tmp_path.glob('calls*')))}"
        env.update(extra, STUB_LOG=str(log))
        done = subprocess.run(
            ["bash", str(tmp_path / "script"), *args], env=env, capture_output=True, text=True
        )
        return done.stdout + log.read_text()

    assert "--memeval-resume" not in calls("resume")  # no journal yet: a fresh run
    shard = p.shard_dir(3)
    stage = unfinished(shard, done=1)  # killed after one scenario
    assert "--memeval-resume" not in calls()  # submit: a fresh run (in a new subsets/ dir)
    resumed = calls("resume")  # resubmit
    assert "--memeval-resume" in resumed
    assert f"resuming the unfinished shard run in {stage}" in resumed
    assert "--memeval-resume" in calls(SLURM_RESTART_COUNT="1")  # requeued by Slurm
    # The shard finished since (promoted to the top level, created after that subsets run
    # started): nothing is left to continue, the resubmitted task starts afresh.
    write_shard(shard / "top", IDS, 3, 3)
    for name in ("metrics.json", "predictions.jsonl"):
        (shard / "top" / name).rename(shard / name)
    metrics = json.loads((shard / "metrics.json").read_text())
    (shard / "metrics.json").write_text(
        json.dumps({**metrics, "created": "2026-12-01T16:30:00+00:00"})
    )
    assert "--memeval-resume" not in calls("resume")
    # ... and rerun again, killed again: that newer unfinished run is continued.
    newer = unfinished(shard, "20261201T170000Z", done=1)
    resumed = calls("resume")
    assert "--memeval-resume" in resumed and f"unfinished shard run in {newer}" in resumed


# -- a task's verdict -----------------------------------------------------------------------


def test_check_shard(tmp_path: Path) -> None:
    shard = write_shard(tmp_path / "s2", IDS, 2, 3)
    code, line = check_shard(shard, 2, 3, 1)
    assert code == 0 and "shard 2/3 finished: 2 scenario(s)" in line and "exit 1" in line
    assert check_shard(shard, 2, 3, 0)[0] == 0
    code, line = check_shard(shard, 2, 3, 137)
    assert (code, line.split(": ", 1)[1]) == (
        137,
        "shard 2/3 FAILED: killed by signal 9; the shard run did not finish",
    )
    code, line = check_shard(shard, 1, 3, 1)  # another shard's directory
    assert code == INCOMPLETE_EXIT and "holds shard 2/3, not 1/3" in line
    code, line = check_shard(tmp_path / "nothing", 3, 3, 1)
    assert code == INCOMPLETE_EXIT and "no run directory" in line
    crashed = tmp_path / "s3"
    unfinished(crashed, done=1)
    code, line = check_shard(crashed, 3, 3, 1)
    assert code == INCOMPLETE_EXIT and "no metrics.json" in line and "--memeval-resume" in line
    # A finished run at the top, and a newer run of the shard that did not finish (killed,
    # or stopped with scenarios missing): the top is an earlier run, not this task's.
    newer = unfinished(shard, done=1)
    code, line = check_shard(shard, 2, 3, 1)
    assert code == INCOMPLETE_EXIT and "a newer unfinished run" in line and str(newer) in line
    code, line = check_shard(shard, 2, 3, 137)
    assert code == 137
    (newer / "journal.jsonl").unlink()
    newer.rmdir()
    metrics = json.loads((shard / "metrics.json").read_text())
    metrics["missing"] = [IDS[3]]
    (shard / "metrics.json").write_text(json.dumps(metrics))
    code, line = check_shard(shard, 2, 3, 1)
    assert code == INCOMPLETE_EXIT and f"1 scenario(s) have no result: {IDS[3]!r}" in line


def test_check_shard_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = write_shard(tmp_path / "s1", IDS, 1, 3)
    assert main(["slurm", "check-shard", str(shard), "--shard", "1/3", "--pytest-exit", "1"]) == 0
    assert "shard 1/3 finished: 3 scenario(s)" in capsys.readouterr().out
    assert main(["slurm", "check-shard", str(shard), "--shard=0/3", "--pytest-exit=1"]) == 2
    assert "K must be in 1..3" in capsys.readouterr().err


# -- reading Slurm ----------------------------------------------------------------------------


def test_parse_scontrol_and_array_tasks() -> None:
    records = parse_scontrol("\n".join([PENDING_ARRAY, RUNNING_TASK, FAILED_TASK, ""]))
    assert [r["JobId"] for r in records] == ["7", "8", "9"]
    assert records[0]["Command"] == "/srv/my runs/slurm/shards.sbatch"  # value with a space
    assert records[0]["WorkDir"] == "/srv/my project"
    assert records[0]["NodeList"] == ""
    assert array_tasks("2-3") == {2, 3}
    assert array_tasks("1,4-6%2") == {1, 4, 5, 6}
    assert array_tasks("1-7:3") == {1, 4, 7}
    assert array_tasks("5") == {5}
    assert array_tasks("") == set()
    # A pending array is one record for all its tasks, each task its own once started.
    pending = parse_scontrol(PENDING_ARRAY + "\n" + RUNNING_TASK)
    assert task_info(pending, "7", 1) == JobInfo("7_1", "RUNNING", "None", "0:0", "node01")
    info = task_info(pending, "7", 3)
    assert info is not None and info.state == "PENDING" and not info.final
    assert task_info(pending, "7", 4) is None
    assert task_info(pending, "70", 1) is None
    failed = task_info(parse_scontrol(FAILED_TASK), "7", 2)
    assert failed is not None and failed.final
    assert failed.describe() == "job 7_2 FAILED (NonZeroExitCode), exit 137"
    merge = JobInfo.from_record("10", parse_scontrol(CANCELLED_MERGE)[0])
    assert merge.describe() == "job 10 CANCELLED (DependencyNeverSatisfied)"
    killed = JobInfo("5", "CANCELLED", "None", "0:9")
    assert killed.describe() == "job 5 CANCELLED, exit 0 (signal 9)"


def test_shard_states(tmp_path: Path) -> None:
    p = plan(tmp_path)
    write_shard(p.shard_dir(1), IDS, 1, 3)
    log = p.shard_log(2, "7")
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(20)) + "memeval: shard 2/3 FAILED\n")
    unfinished(p.shard_dir(2), done=1)
    jobs = [{"kind": "shards", "job_id": "7", "tasks": [1, 2, 3]}, {"kind": "merge"}]
    asked: list[str] = []

    def show_job(job_id: str) -> list[dict[str, str]]:
        asked.append(job_id)
        return parse_scontrol(f"{FAILED_TASK}\n{PENDING_ARRAY}")

    states = shard_states(p, jobs, show_job)
    assert asked == ["7"]  # one question per array job
    assert [s.run for s in states] == ["done", "failed", "pending"]
    assert states[0].detail == "shard 1/3 finished: 3 scenario(s)"
    assert states[1].job is not None and states[1].job.exit_code == "137:0"
    assert (
        states[1].detail.startswith("incomplete shard run: ")
        and "no metrics.json" in states[1].detail
    )
    assert states[1].log_tail[-2:] == ["line 19", "memeval: shard 2/3 FAILED"]
    assert len(states[1].log_tail) == 8
    assert [s.needs_resubmit for s in states] == [False, True, False]

    running = RUNNING_TASK.replace("ArrayTaskId=1", "ArrayTaskId=2")
    states = shard_states(p, jobs, lambda _: parse_scontrol(running))
    assert states[1].run == "running" and states[1].detail == "1 scenario(s) in its journal"
    assert states[2].run == "failed" and "no longer known to Slurm" in states[2].detail
    states = shard_states(p, [], lambda _: [])
    assert [s.run for s in states] == ["done", "missing", "missing"]
    # Resubmitted or submitted again: shard 1's directory still holds the earlier finished
    # run, but its new job has not run yet.
    again = PENDING_ARRAY.replace("ArrayTaskId=2-3", "ArrayTaskId=1-3")
    states = shard_states(p, jobs, lambda _: parse_scontrol(again))
    assert [s.run for s in states] == ["pending", "pending", "pending"]


# -- settings and the command line ------------------------------------------------------------


def project(tmp_path: Path, slurm: str = "") -> Path:
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [tool.pytest.ini_options]
            memeval_out = "results"

            [tool.memeval.ckpt.demo]
            model = "base"
            benchmark = "bench.jsonl"
            """
        )
        + textwrap.dedent(slurm)
    )
    return tmp_path


def test_load_settings(tmp_path: Path) -> None:
    path = (
        project(
            tmp_path,
            """
        [tool.memeval.slurm]
        partition = "gpu"
        time = "01:00:00"
        sbatch_args = ["--qos=high"]
        gpus_per_shard = 8
        """,
        )
        / "pyproject.toml"
    )
    settings, gpus = load_settings(path)
    assert settings == SlurmSettings("gpu", "01:00:00", None, ("--qos=high",))
    assert gpus == 8
    path.write_text("[tool.memeval.slurm]\npartiton = 'gpu'\n")
    with pytest.raises(SlurmError, match=r"pyproject.toml: \[tool.memeval.slurm\]: unknown key"):
        load_settings(path)
    path.write_text("[tool.memeval.slurm]\nsbatch_args = '--qos=high'\n")
    with pytest.raises(SlurmError, match="'sbatch_args' must be a list of strings"):
        load_settings(path)


def test_submit_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(
        tmp_path,
        """
        [tool.memeval.slurm]
        partition = "gpu"
        time = "01:00:00"
        gpus_per_shard = 2
        sbatch_args = ["--qos=high"]
        """,
    )
    monkeypatch.chdir(root)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # dry run: never calls Slurm
    args = ["slurm", "submit", "--ckpt", "demo", "--shards", "4", "--dry-run"]
    assert main([*args, "--time", "00:30:00", "--sbatch-arg=--mem=8G"]) == 0
    out = capsys.readouterr().out
    run_dir = root / "results" / "demo"  # the project's memeval_out ini
    assert f"# {run_dir}/slurm/shards.sbatch" in out
    assert "#SBATCH --array=1-4" in out and "#SBATCH --gpus-per-node=2" in out
    assert "#SBATCH --partition=gpu" in out and "#SBATCH --time=00:30:00" in out
    assert "#SBATCH --qos=high\n#SBATCH --mem=8G" in out
    assert "-m pytest -n 2 --ckpt=demo" in out
    assert f"-o {run_dir}" in out
    assert not (root / "results").exists()  # nothing written
    assert main([*args, "--gpus-per-shard", "0"]) == 0
    assert "-m pytest --memeval-gpus=cpu" in capsys.readouterr().out
    # Free-running shards: each runs pytest --memeval-history=model, into the free-running
    # run directory beside the teacher-forced one.
    assert main([*args, "--history", "model"]) == 0
    out = capsys.readouterr().out
    assert "-m pytest -n 2 --memeval-history=model --ckpt=demo" in out
    assert f"# {root / 'results' / 'demo@history-model'}/slurm/shards.sbatch" in out


def test_submit_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    assert main(["slurm", "submit", "--ckpt", "nope", "--shards", "2"]) == 2
    assert "unknown --ckpt 'nope'" in capsys.readouterr().err
    unsharded = tmp_path / "results" / "demo"
    unsharded.mkdir(parents=True)
    (unsharded / "metrics.json").write_text('{"complete": true}')
    assert main(["slurm", "submit", "--ckpt", "demo", "--shards", "2"]) == 2
    assert "holds a run that is not a merge" in capsys.readouterr().err
    assert main(["slurm", "submit", "--ckpt=demo", "--shards=2", "--out", "other"]) == 2
    assert "sbatch: command not found" in capsys.readouterr().err
    assert main(["slurm", "status", str(unsharded)]) == 2
    assert "not a directory `memeval slurm submit` wrote" in capsys.readouterr().err
    assert main(["slurm", "submit", "--ckpt=demo", "--shards=2", "--out", "a%b"]) == 2
    assert "cannot hold '%'" in capsys.readouterr().err


class FakeSlurm:
    """Answers ``scontrol show job`` from fixed lines (the real one: test_slurm_cluster.py)."""

    def __init__(self, lines: dict[str, str]) -> None:
        self.lines = lines

    def show_job(self, job_id: str) -> list[dict[str, str]]:
        return parse_scontrol(self.lines.get(job_id, ""))


def test_status_names_the_failed_shard_while_the_merge_still_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_memeval.tools.slurm import SUBMISSION, report_status

    p = plan(tmp_path)
    write_shard(p.shard_dir(1), IDS, 1, 3)
    p.slurm_dir.mkdir(parents=True)
    jobs = [
        {"kind": "shards", "job_id": "7", "tasks": [1, 2, 3]},
        {"kind": "merge", "job_id": "10"},
    ]
    (p.slurm_dir / SUBMISSION).write_text(json.dumps({"plan": p.as_dict(), "jobs": jobs}))
    # Shard 3 still runs, so Slurm has not yet cancelled the merge (afterok on an array is
    # decided when every task has ended).
    running3 = RUNNING_TASK.replace("ArrayTaskId=1", "ArrayTaskId=3")
    pending_merge = CANCELLED_MERGE.replace("CANCELLED", "PENDING").replace(
        "DependencyNeverSatisfied", "Dependency"
    )
    fake = FakeSlurm({"7": f"{FAILED_TASK}\n{running3}", "10": pending_merge})
    states, merged = report_status(p.out, fake)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert not merged and [s.run for s in states] == ["done", "failed", "running"]
    assert "  shard 2/3: failed   job 7_2 FAILED (NonZeroExitCode), exit 137;" in out
    assert "merge:     job 10 PENDING (Dependency); will not run: shard(s) 2/3 failed" in out
    fake.lines["10"] = CANCELLED_MERGE
    report_status(p.out, fake)  # type: ignore[arg-type]
    assert "never ran: a shard failed" in capsys.readouterr().out


class RecordingSlurm(FakeSlurm):
    """Also takes submissions: records each sbatch's arguments, hands out job ids."""

    def __init__(self, lines: dict[str, str]) -> None:
        super().__init__(lines)
        self.submitted: list[list[str]] = []
        self.cancelled: list[str] = []

    def sbatch(self, args: list[str]) -> str:
        self.submitted.append(args)
        return str(20 + len(self.submitted))

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def test_resubmit_only_the_failed_shard_while_another_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_memeval.tools.slurm import SUBMISSION, cli_main

    p = plan(tmp_path)
    write_shard(p.shard_dir(1), IDS, 1, 3)
    p.slurm_dir.mkdir(parents=True)
    jobs = [
        {"kind": "shards", "job_id": "7", "tasks": [1, 2, 3]},
        {"kind": "merge", "job_id": "10"},
    ]
    (p.slurm_dir / SUBMISSION).write_text(json.dumps({"plan": p.as_dict(), "jobs": jobs}))
    running3 = RUNNING_TASK.replace("ArrayTaskId=1", "ArrayTaskId=3")
    pending_merge = CANCELLED_MERGE.replace("CANCELLED", "PENDING")
    fake = RecordingSlurm({"7": f"{FAILED_TASK}\n{running3}", "10": pending_merge})
    args = argparse.Namespace(slurm_command="resubmit", out=p.out, wait=False, poll=1.0)
    assert cli_main(args, fake) == 0  # type: ignore[arg-type]
    assert fake.submitted == [
        ["--array=2", str(p.slurm_dir / "shards.sbatch"), "resume"],
        [
            "--dependency=afterok:21:7_3",  # the new array and the shard still running
            "--kill-on-invalid-dep=yes",
            str(p.slurm_dir / "merge.sbatch"),
        ],
    ]
    assert fake.cancelled == ["10"]  # the old merge would never run
    record = json.loads((p.slurm_dir / SUBMISSION).read_text())
    assert [(j["kind"], j["job_id"]) for j in record["jobs"]] == [
        ("shards", "7"),
        ("merge", "10"),
        ("shards", "21"),
        ("merge", "22"),
    ]
    assert "resubmitted shard(s) 2/3 as array job 21" in capsys.readouterr().out


# -- what the new run-directory layout means for Slurm ------------------------------------------


def test_unfinished_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's question: which unfinished run would --memeval-resume continue?"""
    shard = tmp_path / "shard-1-of-3"
    assert main(["slurm", "unfinished", str(shard)]) == 1  # nothing there
    write_shard(shard, IDS, 1, 3)
    assert main(["slurm", "unfinished", str(shard)]) == 1  # only a finished run
    stage = unfinished(shard)
    capsys.readouterr()
    assert main(["slurm", "unfinished", str(shard)]) == 0
    assert capsys.readouterr().out.strip() == str(stage)
    (shard / "metrics.json").write_text("{damaged")  # not a finished run; the journal counts
    assert main(["slurm", "unfinished", str(shard)]) == 0
    assert capsys.readouterr().out.strip() == str(stage)


def test_status_of_a_shard_rerun_after_an_earlier_finished_run(tmp_path: Path) -> None:
    """A shard directory holds a finished run of an earlier submission; this submission's
    task ran it again and failed. That is a failed shard, whether or not its run journaled
    anything (killed at model load: nothing in subsets/)."""
    p = plan(tmp_path)
    for k in (1, 2, 3):
        write_shard(p.shard_dir(k), IDS, k, 3)
    jobs = [{"kind": "shards", "job_id": "7", "tasks": [1, 2, 3]}]
    failed1 = FAILED_TASK.replace("ArrayTaskId=2", "ArrayTaskId=1")
    running3 = RUNNING_TASK.replace("ArrayTaskId=1", "ArrayTaskId=3")
    unfinished(p.shard_dir(1), done=1)
    unfinished(p.shard_dir(3), done=2)
    states = shard_states(
        p, jobs, lambda _: parse_scontrol(f"{failed1}\n{FAILED_TASK}\n{running3}")
    )
    assert [s.run for s in states] == ["failed", "failed", "running"]
    assert "a newer unfinished run" in states[0].detail
    assert states[1].detail == (
        "the task failed; the finished shard run in the directory is an earlier one"
    )
    # The running task's count is its own journal's, not the earlier finished run's.
    assert states[2].detail == "2 scenario(s) in its journal"
    assert [s.needs_resubmit for s in states] == [True, True, False]


def test_submit_refuses_an_out_dir_with_an_unfinished_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    stage = unfinished(tmp_path / "results" / "demo", done=1)  # an unsharded run, killed
    assert main(["slurm", "submit", "--ckpt", "demo", "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert f"holds an unfinished run ({stage})" in err and "choose another --out" in err


def slurm_holder(host: str, job: str, task: str, restart: str) -> dict[str, Any]:
    """A lock holder as RunLock writes it inside Slurm task ``task`` of array ``job``."""
    return {
        "pid": 4242,
        "host": host,
        "started": "2026-12-01T16:00:00+00:00",
        "proc_start": "99",
        "argv": ["pytest", "--memeval-shard=2/3"],
        "writes": None,
        "slurm": {
            "job_id": str(int(job) + int(task)),
            "array_job_id": job,
            "array_task_id": task,
            "restart_count": restart,
            "cluster": "gpu",
        },
    }


def test_lock_of_a_requeued_task_is_taken_over_on_another_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm requeued task 7_2 (node failure, preemption) onto another node: the lock of its
    first incarnation names a host nobody can check, but the same job and task with a lower
    restart count is over; anything else stays refused."""
    from pytest_memeval.core.runlock import LOCK_NAME, LockHeld, RunLock, describe_holder

    run_dir = tmp_path / "shard-2-of-3"
    run_dir.mkdir()
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_ARRAY_JOB_ID": "7",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_CLUSTER_NAME": "gpu",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    first = slurm_holder("node01", "7", "2", "0")
    for other, named in (
        (slurm_holder("node01", "7", "2", "1"), " in Slurm job 7_2 (restart 1)"),  # not requeued
        (slurm_holder("node01", "7", "3", "0"), " in Slurm job 7_3 (restart 0)"),  # another task
        ({**first, "slurm": {**first["slurm"], "cluster": "cpu"}}, " in Slurm job 7_2 (restart 0)"),
        ({k: v for k, v in first.items() if k != "slurm"}, ""),  # not a Slurm job
    ):
        (run_dir / LOCK_NAME).write_text(json.dumps(other))
        with pytest.raises(LockHeld) as refused:
            RunLock.acquire(run_dir)
        assert f"pid 4242 on host node01{named} since" in str(refused.value)
        assert "cannot be checked from" in str(refused.value)
    (run_dir / LOCK_NAME).write_text(json.dumps(first))
    lock = RunLock.acquire(run_dir)
    assert lock.took_over == first  # the controller prints this, naming the job
    assert "pid 4242 on host node01 in Slurm job 7_2 (restart 0) since" in describe_holder(first)
    mine = json.loads((run_dir / LOCK_NAME).read_text())
    assert mine["slurm"] == {
        "job_id": "9",
        "array_job_id": "7",
        "array_task_id": "2",
        "restart_count": "1",
        "cluster": "gpu",
    }
    lock.release()
    assert not (run_dir / LOCK_NAME).exists()


def test_resubmit_clears_the_lock_of_a_task_killed_on_a_lost_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Task 7_2 was killed on node02 (node failure): its lock names node02, where no pid can
    be checked from here, but Slurm says the job is FAILED: resubmit clears it (and says
    so), so the task may run on any node. A lock whose job still runs refuses the resubmit."""
    from pytest_memeval.core.runlock import LOCK_NAME
    from pytest_memeval.tools.slurm import SUBMISSION, cli_main

    p = plan(tmp_path)
    for k in (1, 3):
        write_shard(p.shard_dir(k), IDS, k, 3)
    unfinished(p.shard_dir(2), done=1)
    lock = p.shard_dir(2) / LOCK_NAME
    held = slurm_holder("node02", "7", "2", "0")
    held["slurm"]["job_id"] = "9"  # FAILED_TASK's JobId
    lock.write_text(json.dumps(held))
    p.slurm_dir.mkdir(parents=True)
    jobs = [
        {"kind": "shards", "job_id": "7", "tasks": [1, 2, 3]},
        {"kind": "merge", "job_id": "10"},
    ]
    (p.slurm_dir / SUBMISSION).write_text(json.dumps({"plan": p.as_dict(), "jobs": jobs}))
    ok1 = RUNNING_TASK.replace("RUNNING", "COMPLETED")
    ok3 = ok1.replace("ArrayTaskId=1", "ArrayTaskId=3").replace("JobId=8", "JobId=11")
    # `scontrol show job 9` (the holder's job) answers with task 7_2's own record.
    lines = {"7": f"{ok1}\n{FAILED_TASK}\n{ok3}", "9": FAILED_TASK, "10": CANCELLED_MERGE}
    args = argparse.Namespace(slurm_command="resubmit", out=p.out, wait=False, poll=1.0)

    # Slurm still runs the holder's job (say, an earlier task stuck in completing): refused,
    # nothing submitted, the lock left alone.
    fake = RecordingSlurm(
        {**lines, "9": FAILED_TASK.replace("JobState=FAILED", "JobState=RUNNING")}
    )
    assert cli_main(args, fake) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert f"{p.shard_dir(2)} is in use by pid 4242 on host node02 in Slurm job 7_2" in err
    assert "Slurm job 7_2 is RUNNING; wait for it or scancel it" in err
    assert fake.submitted == [] and lock.exists()

    fake = RecordingSlurm(lines)
    assert cli_main(args, fake) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"removed the stale lock {lock} of pid 4242 on host node02 in Slurm job 7_2" in out
    assert out.count("removed the stale lock") == 1
    assert "Slurm job 7_2 is FAILED" in out
    assert not lock.exists()
    assert fake.submitted[0] == ["--array=2", str(p.slurm_dir / "shards.sbatch"), "resume"]


def test_stale_lock_verdicts() -> None:
    """Slurm's word on a lock from another host; a job it forgot counts as ended only when
    it is one of this submission's jobs."""
    from pytest_memeval.tools.slurm import stale_lock

    held = slurm_holder("node02", "7", "2", "0")
    held["slurm"]["job_id"] = "9"
    assert stale_lock(held, lambda _: parse_scontrol(FAILED_TASK)) == (
        True,
        "Slurm job 7_2 is FAILED",
    )
    assert stale_lock(held, lambda _: [], ours=["7", "10"]) == (
        True,
        "Slurm job 7_2 has ended (Slurm no longer knows it)",
    )
    assert stale_lock(held, lambda _: []) == (None, "Slurm does not know job 7_2")
    pending = PENDING_ARRAY.replace("JobId=7 ", "JobId=9 ")
    assert stale_lock(held, lambda _: parse_scontrol(pending))[0] is False
    plain = {k: v for k, v in held.items() if k != "slurm"}
    stale, why = stale_lock(plain, lambda _: [])
    assert stale is None and "not taken in a Slurm job" in why
    here = {**plain, "host": socket.gethostname(), "pid": os.getpid()}
    here.pop("proc_start")
    assert stale_lock(here, lambda _: []) == (False, "its process is still running")
