"""``memeval slurm`` against a real one-node Slurm cluster on localhost.

The session fixture starts ``munged``, ``slurmctld`` and ``slurmd`` (Debian's ``munge`` and
``slurm-wlm``; ``.ci/run`` installs them) from a generated ``slurm.conf`` in a temporary
directory, with its own munge key and socket and free ports, and stops them by PID at the end.
Skipped only where Slurm is not installed or we are not root (``slurmd`` starts jobs as their
user); on CI (``CI=true``) that is a failure instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_memeval.core.recount import recount_run
from pytest_memeval.tools.cli import main

from ..conftest import (
    ADAPTERS,
    BASE_MODEL,
    INNER_ADDOPTS,
    MemevalProject,
    demo_records,
    fork_started_programs,
)
from ..envs import TWC_TABLE, require_textworld
from ..runfactory import COUNT_FIELDS, content, read_jsonl

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


@dataclass
class Cluster:
    conf: Path
    root: Path


def _unavailable() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} not found): "
            "apt-get install slurm-wlm munge (.ci/run installs them)"
        )
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts jobs as their user)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the Slurm test: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir()
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    cpus = len(os.sched_getaffinity(0))
    conf = root / "slurm.conf"
    conf.write_text(
        textwrap.dedent(
            f"""\
            ClusterName=memeval-test
            SlurmctldHost={host}(127.0.0.1)
            SlurmctldPort={_free_port()}
            SlurmdPort={_free_port()}
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={munge}/munge.socket
            SlurmUser=root
            SlurmdUser=root
            StateSaveLocation={root}/state
            SlurmdSpoolDir={root}/spool
            SlurmctldPidFile={root}/slurmctld.pid
            SlurmdPidFile={root}/slurmd.pid
            SlurmctldLogFile={root}/log/slurmctld.log
            SlurmdLogFile={root}/log/slurmd.log
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            MpiDefault=none
            # Schedule at once (the default batch delay is ~3 s a job) and keep ended jobs
            # visible to scontrol (there is no accounting database to ask).
            SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
            MinJobAge=3600
            ReturnToService=2
            NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
            PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pid_files = [munge / "munged.pid", root / "slurmctld.pid", root / "slurmd.pid"]
    commands = [
        [
            "munged",
            "--force",
            f"--socket={munge}/munge.socket",
            f"--key-file={key}",
            f"--pid-file={pid_files[0]}",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
        ],
        ["slurmctld", "-f", str(conf), "-i"],
        ["slurmd", "-f", str(conf)],
    ]
    try:
        for command in commands:  # each daemonises and writes its pid file
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            ).stdout.strip()
            if state == "idle":
                break
            if time.monotonic() > deadline:
                log = (root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"the local Slurm node never became idle (sinfo: {state!r}):\n{log}")
            time.sleep(0.5)
        yield Cluster(conf=conf, root=root)
    finally:
        _stop([pid for pid in (_pid(p) for p in reversed(pid_files)) if pid is not None])


# -- the project: four short demo scenarios, three shards (2 + 1 + 1) ---------------------------

FROZEN_PROFILE = """
[tool.memeval.ckpt.frozen]
model = "ckpt/base"
adapter = "ckpt/adapter"
benchmark = "bench.jsonl"
generation = { max_new_tokens = 16 }

[tool.memeval.slurm]
time = "00:10:00"
sbatch_args = ["--cpus-per-task=1"]
"""

# Simulates a node lost mid-shard: once shard 1 has journaled one scenario, its pytest is
# killed with SIGKILL (no cleanup at all). Only while the marker file exists: removing it
# first makes the crash happen once, so the resubmitted shard can finish.
CRASH_CONFTEST = """
import os
import signal
from pathlib import Path

from pytest_memeval.compat.pytest import report_record

MARKER = Path(__file__).with_name("crash-shard-1")


def pytest_runtest_logreport(report):
    if (
        report_record(report)
        and os.environ.get("SLURM_ARRAY_TASK_ID") == "1"
        and MARKER.exists()
    ):
        MARKER.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def slurm(*args: object) -> int:
    return main(["slurm", *map(str, args)])


def test_slurm_submit_fail_resubmit_merge(
    slurm_cluster: Cluster,
    memeval_project: MemevalProject,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # The jobs' Python (the batch scripts' $PYTHON) forks from the tests' fork server: a job's
    # pytest then spends no time importing torch. Killed, its launcher ends as it did.
    fork_started_programs(monkeypatch)
    # Jobs inherit this environment (sbatch's default --export=ALL): one torch thread per
    # shard, as each task is given one CPU; and nothing of this pytest session's xdist.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(var, raising=False)
    project = memeval_project.path
    pool = demo_records("baseline", 40)
    short = sorted(sorted(pool, key=lambda r: len(r["messages"]))[:4], key=pool.index)
    # A private copy of the checkpoint: every run here must see the same weights.
    shutil.copytree(BASE_MODEL, project / "ckpt" / "base")
    shutil.copytree(ADAPTERS / "baseline", project / "ckpt" / "adapter")
    memeval_project.write(short, profiles=FROZEN_PROFILE)
    (project / "conftest.py").write_text(CRASH_CONFTEST, "utf-8")

    reference = project / "reference"
    full = memeval_project.run("--ckpt", "frozen", f"--memeval-out={reference}")
    assert full.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), full.stdout.str()
    expected = content(read_jsonl(reference / "predictions.jsonl"))
    assert len(expected) == 4
    counts = json.loads((reference / "metrics.json").read_text("utf-8"))
    counts = {k: counts[k] for k in COUNT_FIELDS}

    # 1. Three shards, merged by the merge job; --wait exits 0 on a complete merged run.
    capsys.readouterr()
    assert slurm("submit", "--ckpt", "frozen", "--shards", 3, "--wait", "--poll", 1) == 0
    out = capsys.readouterr().out
    first = project / "runs" / "frozen"
    assert f"merged run complete: {first}" in out
    merged = json.loads((first / "metrics.json").read_text("utf-8"))
    assert merged["complete"] is True and merged["n"] == 4
    assert [m["shard"] for m in merged["merged_from"]] == ["1/3", "2/3", "3/3"]
    recount_run(first)
    assert content(read_jsonl(first / "predictions.jsonl")) == expected
    assert {k: merged[k] for k in COUNT_FIELDS} == counts
    for k in (1, 2, 3):
        assert f"shard {k}/3: done" in out
    # A shard whose pytest exits 1 (wrong answers) is a finished shard: its task succeeded.
    logs = "".join(p.read_text() for p in (first / "slurm" / "logs").glob("shard-*.log"))
    wrong = merged["m1"]["total"] - merged["m1"]["correct"]
    assert wrong > 0, "the baseline adapter should get some of these wrong"
    assert "(pytest exit 1: wrong answers are results)" in logs

    # 2. Shard 1 is killed mid-run: its task fails, the merge job never runs.
    (project / "crash-shard-1").touch()
    second = project / "runs" / "second try"  # a space in the path, as users have
    rc = slurm("submit", "--ckpt=frozen", "--shards=3", "--out", second, "--wait", "--poll=1")
    captured = capsys.readouterr()
    assert rc == 1, captured.out + captured.err
    assert not (project / "crash-shard-1").exists()  # the crash really happened
    assert "shard(s) not finished: 1/3" in captured.err
    assert not (second / "metrics.json").exists()
    assert "merge:" in captured.out and "never ran: a shard failed" in captured.out
    assert "DependencyNeverSatisfied" in captured.out

    assert slurm("status", second) == 1
    status = capsys.readouterr().out
    assert "shard 2/3: done" in status and "shard 3/3: done" in status
    assert "shard 1/3: failed" in status
    assert "exit 137" in status  # 128 + SIGKILL, from the task's own exit status
    assert "memeval: shard 1/3 FAILED: killed by signal 9" in status  # the log's last lines
    # The killed run journaled into subsets/<time>/ (a run that did not finish never touches
    # the top level): header + the one scenario done before the kill.
    shard1_dir = second / "shard-1-of-3"
    journals = list(shard1_dir.glob("subsets/*/journal.jsonl"))
    assert len(journals) == 1, journals
    assert len(read_jsonl(journals[0])) == 2
    assert not (shard1_dir / "metrics.json").exists()
    # The SIGKILLed pytest left its lock, naming its Slurm job. As if the node were lost
    # (the resubmitted task may run on another node, which cannot check that pid): only
    # Slurm's word that the job ended can clear it.
    lock = shard1_dir / "memeval.lock"
    holder = json.loads(lock.read_text("utf-8"))
    array_job = json.loads((second / "slurm" / "submission.json").read_text("utf-8"))["jobs"][0]
    assert holder["slurm"]["array_job_id"] == array_job["job_id"]
    assert holder["slurm"]["array_task_id"] == "1"
    lock.write_text(json.dumps({**holder, "host": "lost-node-7"}), "utf-8")

    # 3. Resubmit: only shard 1 runs again, resumed from its journal; then the merge.
    assert slurm("resubmit", second, "--wait", "--poll", 1) == 0
    out = capsys.readouterr().out
    assert f"removed the stale lock {lock} of pid {holder['pid']} on host lost-node-7" in out
    assert f"Slurm job {array_job['job_id']}_1 is FAILED" in out
    assert "resubmitted shard(s) 1/3" in out
    assert f"merged run complete: {second}" in out
    submission = json.loads((second / "slurm" / "submission.json").read_text("utf-8"))
    resubmitted = submission["jobs"][2]["job_id"]
    log = (second / "slurm" / "logs" / f"shard-1-of-3.job-{resubmitted}.log").read_text()
    assert f"resuming the unfinished shard run in {journals[0].parent}" in log
    assert "--memeval-resume" in log
    assert [(j["kind"], j.get("tasks")) for j in submission["jobs"]] == [
        ("shards", [1, 2, 3]),
        ("merge", None),
        ("shards", [1]),
        ("merge", None),
    ]
    # The resubmitted shard continued the killed run (one scenario from its journal, one
    # decoded), and that finished run was promoted to the top of the shard directory.
    shard1 = json.loads((shard1_dir / "metrics.json").read_text("utf-8"))
    assert shard1["scope"]["resumed"] == 1 and shard1["scope"]["evaluated"] == 2
    assert not journals[0].exists() and len(read_jsonl(shard1_dir / "journal.jsonl")) == 3
    assert not lock.exists()
    recount_run(second)
    merged = json.loads((second / "metrics.json").read_text("utf-8"))
    assert merged["complete"] is True
    assert {k: merged[k] for k in COUNT_FIELDS} == counts
    assert content(read_jsonl(second / "predictions.jsonl")) == expected
    assert slurm("resubmit", second) == 0
    assert "nothing to resubmit" in capsys.readouterr().out


# -- a closed-loop profile: four twc episodes, two shards -------------------------------------

PARAMS = TWC_TABLE["params"]
ENV_REST = 'fold = "test", seeds = "0-3", max_steps = 2'  # TOML's inline tables: one line
EPISODE_PROFILE = f"""
[tool.memeval.ckpt.acting]
model = "ckpt/base"
adapter = "ckpt/adapter"
generation = {{ max_new_tokens = 6 }}
env = {{ backend = "textworld_express", game = "twc", params = "{PARAMS}", {ENV_REST} }}

[tool.memeval.slurm]
time = "00:10:00"
sbatch_args = ["--cpus-per-task=1"]
"""


def test_slurm_runs_closed_loop_shards_and_merges_them(
    slurm_cluster: Cluster,
    memeval_project: MemevalProject,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Episode shards as Slurm array tasks (each with its own TextWorld Express JVM), the
    merge job's episode merge: the merged run holds exactly the unsharded run's episodes."""
    require_textworld()
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    fork_started_programs(monkeypatch)  # as in the test above
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(var, raising=False)
    project = memeval_project.path
    shutil.copytree(BASE_MODEL, project / "ckpt" / "base")
    shutil.copytree(ADAPTERS / "oracle", project / "ckpt" / "adapter")
    text = f'[tool.pytest.ini_options]\naddopts = "{INNER_ADDOPTS}"\n' + EPISODE_PROFILE
    (project / "pyproject.toml").write_text(text, "utf-8")

    reference = project / "reference"
    full = memeval_project.run("--ckpt", "acting", f"--memeval-out={reference}")
    assert full.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), full.stdout.str()
    expected = read_jsonl(reference / "predictions.jsonl")
    assert [r["id"] for r in expected] == [f"twc-{seed}" for seed in range(4)]

    capsys.readouterr()
    assert slurm("submit", "--ckpt", "acting", "--shards", 2, "--wait", "--poll", 1) == 0
    out = capsys.readouterr().out
    merged_dir = project / "runs" / "acting"
    assert f"merged run complete: {merged_dir}" in out
    for k in (1, 2):
        assert f"shard {k}/2: done" in out
    assert "merge:" in out and "episodes=4 success=" in out  # the status names what merged
    merged = json.loads((merged_dir / "metrics.json").read_text("utf-8"))
    assert merged["kind"] == "episodes" and merged["complete"] is True
    assert main(["recount", str(merged_dir)]) == 0
    assert read_jsonl(merged_dir / "predictions.jsonl") == expected
