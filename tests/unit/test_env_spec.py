"""A profile's env table: parsing, seed expressions, and errors that name the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_memeval.env import (
    DEFAULT_MAX_STEPS,
    MAX_SEEDS,
    EnvSpec,
    EnvSpecError,
    parse_env_spec,
    parse_seeds,
)

from ..envs import TWC_TABLE


def test_the_issues_example_table_resolves() -> None:
    spec = parse_env_spec(
        {
            "backend": "textworld_express",
            "game": "twc",
            "params": "numLocations=1,numItemsToPutAway=2",
            "fold": "test",
            "seeds": "0-99",
            "max_steps": 40,
        }
    )
    assert spec.backend == "textworld_express" and spec.game == "twc" and spec.fold == "test"
    assert spec.seeds == tuple(range(100))
    assert spec.params == (("numItemsToPutAway", 2), ("numLocations", 1))
    assert spec.params_text == "numItemsToPutAway=2,numLocations=1"
    assert spec.max_steps == 40
    assert spec.invalid_action_limit is None  # no invalid-action limit unless the profile sets one


def test_defaults_and_a_params_table_equal_to_its_string() -> None:
    table = parse_env_spec(
        {"backend": "b", "game": "g", "seeds": 3, "params": {"b": True, "a": 1, "c": "x"}}
    )
    text = parse_env_spec({"backend": "b", "game": "g", "seeds": 3, "params": "c=x,a=1,b=1"})
    assert table.max_steps == DEFAULT_MAX_STEPS and table.fold is None and table.seeds == (3,)
    assert table.params_text == text.params_text == "a=1,b=1,c=x"


def test_a_spec_is_plain_json_and_hashable() -> None:
    spec = parse_env_spec(TWC_TABLE)
    assert json.loads(json.dumps(spec.as_plain())) == spec.as_plain()
    assert spec == parse_env_spec(dict(TWC_TABLE)) and hash(spec) == hash(parse_env_spec(TWC_TABLE))
    assert isinstance(spec, EnvSpec)


@pytest.mark.parametrize(
    ("value", "seeds"),
    [
        ("0-4", (0, 1, 2, 3, 4)),
        ("1,3,5-7", (1, 3, 5, 6, 7)),
        (" 9 , 2-3 ", (9, 2, 3)),  # order as written
        ("7", (7,)),
        ("20000-20002", (20000, 20001, 20002)),
        (5, (5,)),
        ([4, 0, 2], (4, 0, 2)),
    ],
)
def test_seed_expressions(value: Any, seeds: tuple[int, ...]) -> None:
    assert parse_seeds(value) == seeds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "'' is not a seed"),
        ("1,,2", "'' is not a seed"),
        ("a-3", "'a-3' is not a seed or a range"),
        ("5-2", "the range '5-2' runs backwards"),
        ("1,2,1", "seed 1 appears twice"),
        ("0-3,2", "seed 2 appears twice"),
        ([1, -1], "seeds must be 0 or more, got -1"),
        ("-3", "'-3' is not a seed"),
        ([], "no seeds"),
        ([1, "2"], "must hold integers only"),
        (True, "got a boolean"),
        (1.5, "got float"),
        (f"0-{MAX_SEEDS}", f"more than {MAX_SEEDS} seeds"),
    ],
)
def test_bad_seeds_name_the_key(value: Any, message: str) -> None:
    with pytest.raises(EnvSpecError) as info:
        parse_seeds(value, "env.seeds")
    assert str(info.value).startswith("env.seeds: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": ""}, "env.backend: must be a non-empty string"),
        ({"game": 3}, "env.game: must be a non-empty string, got 3"),
        ({"fold": ["test"]}, "env.fold: must be a non-empty string"),
        ({"seeds": "x"}, "env.seeds: 'x' is not a seed"),
        ({"max_steps": 0}, "env.max_steps: must be a positive integer, got 0"),
        ({"max_steps": True}, "env.max_steps: must be a positive integer, got True"),
        ({"max_steps": 2.5}, "env.max_steps: must be a positive integer"),
        ({"invalid_action_limit": 0}, "env.invalid_action_limit: must be a positive integer"),
        ({"step_timeout_s": 0}, "env.step_timeout_s: must be a positive number, got 0"),
        ({"step_timeout_s": float("inf")}, "env.step_timeout_s: must be a positive number"),
        ({"step_timeout_s": "5"}, "env.step_timeout_s: must be a positive number, got '5'"),
        ({"params": "numLocations"}, "env.params: 'numLocations' is not key=value"),
        ({"params": "=3"}, "env.params: '=3' is not key=value"),
        ({"params": "a=1,a=2"}, "env.params: a given twice"),
        ({"params": {"a": [1]}}, "env.params.a: a parameter must be a string, number or boolean"),
        ({"params": 3}, 'env.params: expected "k=v,k=v" or a table, got int'),
        ({"seed": "0-9"}, "env: unknown key(s) seed (known: backend, game, params"),
    ],
)
def test_bad_tables_name_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvSpecError) as info:
        parse_env_spec({**TWC_TABLE, **change})
    assert message in str(info.value)


def test_missing_keys_and_a_non_table_are_named() -> None:
    with pytest.raises(EnvSpecError, match=r"env: missing required key\(s\) game, seeds"):
        parse_env_spec({"backend": "textworld_express"})
    with pytest.raises(EnvSpecError, match="env: must be a table, got str"):
        parse_env_spec("twc")
    with pytest.raises(EnvSpecError, match=r"^tool\.memeval\.ckpt\.x\.env\.max_steps: "):
        parse_env_spec({**TWC_TABLE, "max_steps": -1}, "tool.memeval.ckpt.x.env")
