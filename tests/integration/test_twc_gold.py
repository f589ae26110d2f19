"""The twc_gold builder for real: TextWorld Express's gold paths as benchmark scenarios.

One build of a few seeds serves the module (a JVM started and closed by the builder); a second
build checks determinism, a fresh environment replays the scenarios' actions, and one pytester
run evaluates the built benchmark with the demo checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import BenchmarkError, from_records
from pytest_memeval.core.builders import build_bundled
from pytest_memeval.env import make_env, parse_env_spec

from ..conftest import ADAPTERS, BASE_MODEL, MemevalProject
from ..envs import java_children, require_textworld

# Builds and replays run TextWorld Express JVMs: not the inner loop.
pytestmark = pytest.mark.slow

#: two rooms behind doors, two objects: containers to open on some seeds
PARAMS = "numLocations=2,numItemsToPutAway=2,includeDoors=1,limitInventorySize=0"
OPTIONS: dict[str, Any] = {"params": PARAMS, "fold": "test", "seeds": "0-4", "query": "opened"}


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    require_textworld()
    before = java_children()
    records = build_bundled("twc_gold", OPTIONS, Path("."))
    assert records is not None
    assert java_children() == before, "the builder left a JVM running"
    return [dict(r) for r in records]


def test_records_validate_through_the_benchmark_loader(built: list[dict[str, Any]]) -> None:
    bench = from_records(built, "twc_gold")
    assert [s.id for s in bench.scenarios] == [f"twc-{seed}" for seed in range(5)]
    for scenario, record in zip(bench.scenarios, built, strict=True):
        roles = [m["role"] for m in scenario.messages]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        # strictly alternating after the system message: user, assistant, user, ...
        assert roles[1:] == ["user", "assistant"] * ((len(roles) - 1) // 2)
        assert scenario.messages[0]["content"].startswith("Your task is to pick up objects")
        assert len(scenario.turn_indices) == record["meta"]["gold_actions"]
        assert scenario.tags == tuple(record["tags"])


def test_the_final_answer_is_what_the_gold_path_did(built: list[dict[str, Any]]) -> None:
    queries = set()
    for record in built:
        actions = [m["content"] for m in record["messages"] if m["role"] == "assistant"][:-1]
        question = record["messages"][-2]["content"].rsplit("\n\n", 1)[1]
        answer = record["messages"][-1]["content"]
        opened = [a[len("open ") :] for a in actions if a.startswith("open ") and "door" not in a]
        if opened:
            assert "query:close-opened" in record["tags"] and "container:closed" in record["tags"]
            assert question.startswith("Which container did you open") and answer == opened[0]
            # the observation of that action says so
            turn = actions.index(f"open {answer}")
            said = [m["content"] for m in record["messages"] if m["role"] == "user"][turn + 1]
            assert said.startswith(f"You open the {answer}")
        else:
            put = next(a for a in actions if a.startswith("put "))
            obj = question.removeprefix("Where did you put the ").removesuffix("?")
            assert put in (f"put {obj} in {answer}", f"put {obj} on {answer}")
            assert "query:where-put" in record["tags"]
        queries.add(record["tags"][0])
        assert {"doors", "rooms:2", "objects:2"} <= set(record["tags"])
    assert queries == {"query:close-opened", "query:where-put"}, "seeds 0-4 cover both queries"


def test_replaying_the_gold_actions_in_a_fresh_env_succeeds(built: list[dict[str, Any]]) -> None:
    env_table = {k: v for k, v in OPTIONS.items() if k != "query"}
    spec = parse_env_spec({"backend": "textworld_express", "game": "twc", **env_table})
    env = make_env(spec)
    try:
        for record in built:
            actions = [m["content"] for m in record["messages"] if m["role"] == "assistant"][:-1]
            observation, info = env.reset(record["meta"]["seed"])
            assert observation.strip() == record["messages"][1]["content"]
            assert info.task_description.strip() == record["messages"][0]["content"]
            for action in actions:
                result = env.step(action)
            assert result.info.success, record["id"]
    finally:
        env.close()


def test_two_builds_are_byte_identical(built: list[dict[str, Any]]) -> None:
    again = build_bundled("twc_gold", OPTIONS, Path("."))
    assert again is not None
    assert _jsonl([dict(r) for r in again]) == _jsonl(built)


def test_without_java_one_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    require_textworld()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BenchmarkError, match=r"builder 'twc_gold': .*install Java 17"):
        build_bundled("twc_gold", {"seeds": "0"}, Path("."))


#: a profile over the demo checkpoint whose benchmark is built from two one-room seeds
PROFILE = """
[tool.memeval.ckpt.twc]
model = "{model}"
adapter = "{adapter}"
generation = {{ max_new_tokens = 8 }}

[tool.memeval.ckpt.twc.benchmark]
builder = "twc_gold"
params = "numLocations=1,numItemsToPutAway=1,includeDoors=0"
fold = "test"
seeds = "0-1"
"""


def test_a_profile_evaluates_the_built_benchmark(memeval_project: MemevalProject) -> None:
    require_textworld()
    profile = PROFILE.format(model=BASE_MODEL.as_posix(), adapter=(ADAPTERS / "oracle").as_posix())
    memeval_project.write(profiles=profile)
    result = memeval_project.run("--ckpt", "twc", "-n", "0")
    outcomes = result.parseoutcomes()
    # one final-query item and one turns item per scenario, each scored (passed or failed)
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 4, result.stdout.str()
    predictions = memeval_project.predictions("twc")
    assert sorted(p["id"] for p in predictions) == ["twc-0", "twc-1"]
    metrics = memeval_project.metrics("twc")
    assert metrics["n"] == 2 and metrics["m1"]["total"] == 2
    # every gold action is a scored turn: at least look around, take and put per seed
    assert metrics["m2"]["total"] >= 6
    assert {"query:where-put", "rooms:1", "objects:1"} <= set(metrics["slices"])
    assert metrics["slices"]["query:where-put"]["n"] == 2
