"""Episodes as pytest items, for real: the tiny demo checkpoint acts in TextWorld Express.

``pytest --ckpt NAME`` with a profile holding ``env`` runs ``test_episode[<game>-<seed>]``
per seed; the run directory holds each episode's record and the run's numbers, recounted;
an environment's failure is an error of the item and of the run, which ``--memeval-resume``
completes; no JVM outlives the run (checked through an environment marker every process of
the run inherits, the JVMs included). That a ``-n 2`` run gives the serial run's trajectories
is checked in test_episode_shards.py, against the serial run made there for the shards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.episode_records import read_episode_records, recount_episodes
from pytest_memeval.env import make_env, parse_env_spec

from ..conftest import EVAL_MODULE, MemevalProject
from ..envs import TWC_TABLE, no_jvm_left, require_textworld, twc_profile, write_pyproject


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    """A value in the environment of every process of the runs (the JVMs included)."""
    value = uuid.uuid4().hex
    monkeypatch.setenv("MEMEVAL_TEST_RUN_MARK", value)
    return value


def _trajectories(project: MemevalProject, ckpt: str) -> dict[str, Any]:
    return {r["id"]: r["trajectory"] for r in project.predictions(ckpt)}


@pytest.mark.slow
def test_each_seed_is_an_item_and_the_run_directory_holds_its_episode(
    memeval_project: MemevalProject, marker: str
) -> None:
    require_textworld()
    extra = ", invalid_action_limit = 1"
    write_pyproject(
        memeval_project.path, twc_profile("twc", "0-2", extra=extra) + 'system = "Tidy up."\n'
    )
    result = memeval_project.run("--ckpt", "twc", "-n", "0", "-v", "--junitxml=junit.xml")
    result.assert_outcomes(failed=3)
    junit = (memeval_project.path / "junit.xml").read_text("utf-8")
    assert junit.count('<property name="memeval_reason" value="invalid_actions"') == 3
    assert '<property name="memeval_seed" value="2"' in junit
    for seed in range(3):
        result.stdout.fnmatch_lines([f"memeval::test_episode[[]twc-{seed}[]] FAILED*"])
    result.stdout.fnmatch_lines(
        ["*seed 0: invalid actions after 1 action(s) (1 invalid), score 0; last *"]
    )
    result.stdout.fnmatch_lines(["*memeval closed loop*", "*success 0/3 (0.0%*"])
    run = memeval_project.run_dir("twc")
    records = read_episode_records(run / "predictions.jsonl")
    assert [r["id"] for r in records] == ["twc-0", "twc-1", "twc-2"]
    assert all(r["system"] == "Tidy up." and r["reason"] == "invalid_actions" for r in records)
    assert all(r["steps"] == 1 and r["trajectory"][0]["valid"] is False for r in records)
    assert "numItemsToPutAway=2" in records[0]["tags"] and "game:twc" in records[0]["tags"]
    metrics = memeval_project.metrics("twc")
    assert metrics["complete"] and metrics["missing"] == [] and metrics["error_ids"] == []
    assert metrics["episodes"]["success"]["total"] == 3
    assert metrics["episodes"]["reasons"]["invalid_actions"] == 3
    assert metrics["slices"]["fold:test"] == metrics["episodes"]
    assert metrics["env"]["version"] == "1.1.0" and metrics["env"]["seeds"] == [0, 1, 2]
    assert set(metrics["fingerprints"]) == {"model", "adapter", "tokenizer", "decoding", "env"}
    assert recount_episodes(run / "predictions.jsonl", metrics) == []
    no_jvm_left(marker)
    # Environment determinism: the stored actions, replayed into a fresh environment,
    # give the stored observations.
    env = make_env(parse_env_spec({**TWC_TABLE, "seeds": "0-2"}))
    try:
        for record in records:
            observation, _info = env.reset(record["seed"], None)
            assert observation == record["observation"]
            for step in record["trajectory"]:
                assert env.step(step["action"]).observation == step["observation"]
    finally:
        env.close()


@pytest.mark.slow  # a pytest run (the fork server's first, on its worker)
def test_a_usage_error_names_what_the_env_lacks(memeval_project: MemevalProject) -> None:
    require_textworld()
    write_pyproject(
        memeval_project.path, twc_profile("bad", "0").replace('game = "twc"', 'game = "nosuch"')
    )
    result = memeval_project.run("--ckpt", "bad", "-n", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the profile's env cannot be made here*nosuch*"])
    assert not memeval_project.run_dir("bad").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_closed_loop_profile_given_only_scenario_items_is_a_usage_error(
    memeval_project: MemevalProject, workers: str
) -> None:
    """``pytest test_eval.py --ckpt <closed-loop profile>``: the module holds scenario items
    only, and no episode item is provided for a path: one usage error saying what to run,
    no environment started, nothing written (it was a silent skip)."""
    require_textworld()
    write_pyproject(memeval_project.path, twc_profile("loop", "0-1"))
    (memeval_project.path / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    result = memeval_project.run(
        str(memeval_project.path / "test_eval.py"), "--ckpt", "loop", "-n", workers
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--ckpt loop is a closed-loop profile*only scenario items*pytest --ckpt loop*"]
    )
    assert not memeval_project.run_dir("loop").exists()
    # Without a path the same project runs the episodes, the scenario items skipped with a
    # reason that names the profile
    result = memeval_project.run("--ckpt", "loop", "-n", "0", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 2  # test_final_query, test_turns
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2  # the two episodes
    result.stdout.fnmatch_lines(["*--ckpt loop is a closed-loop profile: its items are*"])
    assert (memeval_project.run_dir("loop") / "metrics.json").is_file()


COUNTING_ENV = """
import os

import pytest

from pytest_memeval.env import TextWorldExpress


@pytest.hookimpl
def pytest_memeval_make_env(config, spec):
    with open(LOG, "a", encoding="utf-8") as fh:
        fh.write(os.environ.get("PYTEST_XDIST_WORKER", "master") + "\\n")
    return TextWorldExpress(spec)
"""


@pytest.mark.slow
def test_under_xdist_each_worker_steps_a_chunk_of_episodes_together(
    memeval_project: MemevalProject,
) -> None:
    """``-n 2``: the episodes go out in chunks (the scenario scheduler, one scope an episode),
    so each worker steps several together, one environment each, where xdist's ``load``
    would queue about two on it; every episode is run once."""
    require_textworld()
    log = memeval_project.path / "made.log"
    conftest = f"LOG = {str(log)!r}\n" + textwrap.dedent(COUNTING_ENV)
    write_pyproject(memeval_project.path, twc_profile("twc", "0-7"), conftest)
    result = memeval_project.run("--ckpt", "twc", "-n", "2")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 8, outcomes
    made = log.read_text("utf-8").split()  # (the controller makes one to describe it)
    assert {"gw0", "gw1"} <= set(made)
    # 8 episodes over 2 workers: a chunk of 4 each (more than xdist's 2 queued)
    assert max(made.count(w) for w in ("gw0", "gw1")) >= 4, made
    records = read_episode_records(memeval_project.run_dir("twc") / "predictions.jsonl")
    assert sorted(r["seed"] for r in records) == list(range(8))


FAULTY_ENV = """
import os
import signal
from pathlib import Path

import pytest

from pytest_memeval.env import EnvError, TextWorldExpress


class Faulty(TextWorldExpress):
    \"\"\"The real environment; its steps in seed SEED meet a fault while FLAG exists.\"\"\"

    def reset(self, seed, options=None):
        self.seed = seed
        return super().reset(seed, options)

    def step(self, action):
        if self.seed == SEED and Path(FLAG).exists():
            fault()
        return super().step(action)


@pytest.hookimpl
def pytest_memeval_make_env(config, spec):
    return Faulty(spec)
"""

#: an environment error: the simulator went away
ENV_ERROR = 'raise EnvError("the simulator went away")'
#: the process stops itself (SIGSTOP: neither working nor dying), its pid in the flag file
STOP = 'Path(FLAG).write_text(str(os.getpid()), "utf-8"); os.kill(os.getpid(), signal.SIGSTOP)'


def faulty_env(flag: Path, seed: int, fault: str) -> str:
    """A project conftest whose environment meets ``fault`` (a line of Python) in each step
    of ``seed`` while ``flag`` exists."""
    head = f"FLAG = {str(flag)!r}\nSEED = {seed}\n\n\ndef fault():\n    {fault}\n"
    return head + textwrap.dedent(FAULTY_ENV)


@pytest.mark.slow
def test_an_environment_error_is_an_error_and_resume_reruns_only_it(
    memeval_project: MemevalProject, marker: str
) -> None:
    require_textworld()
    flag = memeval_project.path / "fail-seed-1"
    flag.write_text("", "utf-8")
    write_pyproject(memeval_project.path, twc_profile("twc", "0-2"), faulty_env(flag, 1, ENV_ERROR))
    first = memeval_project.run("--ckpt", "twc", "-n", "2")
    first.assert_outcomes(failed=2, errors=1)
    first.stdout.fnmatch_lines(
        [
            "*EnvironmentFailure: seed 1: env error*the simulator went away*",
            "*ERROR memeval::test_episode[[]twc-1[]]*",
        ]
    )
    first.stdout.fnmatch_lines(["*INCOMPLETE: environment error in 1 episode(s) (twc-1)*"])
    # A failed episode is one line by default, as a wrong answer is (runtime/failures.py).
    first.stdout.fnmatch_lines(["FAILED memeval::test_episode[[]twc-0[]] - seed 0: step limit*"])
    metrics = memeval_project.metrics("twc")
    assert not metrics["complete"] and metrics["error_ids"] == ["twc-1"]
    assert metrics["episodes"]["errors"] == 1 and metrics["episodes"]["success"]["total"] == 2
    before = _trajectories(memeval_project, "twc")
    flag.unlink()
    second = memeval_project.run("--ckpt", "twc", "-n", "0", "--memeval-resume", "-v")
    second.assert_outcomes(failed=1, deselected=2)
    second.stdout.fnmatch_lines(["*test_episode[[]twc-1[]] FAILED*"])
    metrics = memeval_project.metrics("twc")
    assert metrics["complete"] and metrics["episodes"]["success"]["total"] == 3
    after = _trajectories(memeval_project, "twc")
    assert {k: after[k] for k in ("twc-0", "twc-2")} == {k: before[k] for k in ("twc-0", "twc-2")}
    journal = (memeval_project.run_dir("twc") / "journal.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line).get("id") for line in journal[1:]].count("twc-1") == 2
    no_jvm_left(marker)


@pytest.mark.slow
def test_a_stopped_episode_worker_ends_the_run_after_the_stall_timeout(
    memeval_project: MemevalProject, marker: str
) -> None:
    """``-n 2``, a worker stopped in an environment step: the run stops after
    ``--memeval-stall-timeout`` naming what the worker holds (it waited for ever), the
    episodes finished so far are an unfinished run, and ``--memeval-resume`` completes it."""
    require_textworld()
    flag = memeval_project.path / "stop-seed-3"
    flag.write_text("", "utf-8")
    write_pyproject(memeval_project.path, twc_profile("twc", "0-3"), faulty_env(flag, 3, STOP))
    # Above the other worker's longest gap between events: its first episode item, which
    # starts an environment (a JVM) for each episode of its chunk and steps them together,
    # took over 8 s on a 2-core machine also running a bf16 model test.
    stall_s = 20
    try:
        first = memeval_project.run(
            "--ckpt", "twc", "-n", "2", "--memeval-stall-timeout", str(stall_s), timeout=240
        )
    finally:
        stopped = flag.read_text("utf-8").strip()
        if stopped:  # stop what the test started, by pid (xdist's teardown usually has)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stopped), signal.SIGKILL)
        flag.unlink()
    out = first.stdout.str() + first.stderr.str()
    assert first.ret == pytest.ExitCode.INTERRUPTED, out
    assert f"no worker has reported anything for {stall_s} s" in out, out
    assert "test_episode[twc-3]" in out.split("while items are outstanding")[1], out
    assert "results so far are kept in" in out and "rerun with --memeval-resume" in out, out
    assert stopped, "the environment never stopped its worker"
    run = memeval_project.latest_subset("twc")
    metrics = json.loads((run / "metrics.json").read_text("utf-8"))
    assert not metrics["complete"] and "twc-3" in metrics["missing"], metrics
    kept = [r["id"] for r in read_episode_records(run / "predictions.jsonl")]
    assert kept and "twc-3" not in kept, "the other worker's episodes were not kept"
    assert sorted(kept + metrics["missing"]) == ["twc-0", "twc-1", "twc-2", "twc-3"]
    second = memeval_project.run("--ckpt", "twc", "-n", "0", "--memeval-resume")
    second.assert_outcomes(failed=4 - len(kept), deselected=len(kept))
    metrics = memeval_project.metrics("twc")
    assert metrics["complete"] and metrics["episodes"]["success"]["total"] == 4
    assert recount_episodes(memeval_project.run_dir("twc") / "predictions.jsonl", metrics) == []
    no_jvm_left(marker)
