"""The twc_gold builder's pure parts: gold actions -> question, answer and tags (no JVM)."""

from __future__ import annotations

import pytest

from pytest_memeval.core.builders import BUILDERS, twc_gold
from pytest_memeval.env import parse_env_spec

GOLD = (
    "look around",
    "take newspaper",
    "open door to south",
    "move south",
    "take dirty mesh skimmer",
    "put newspaper on side table",
    "open dishwasher",
    "open kitchen cupboard",
    "put dirty mesh skimmer in dishwasher",
)
SPEC = parse_env_spec(
    {
        "backend": "textworld_express",
        "game": "twc",
        "params": "numLocations=2,numItemsToPutAway=2,includeDoors=1",
        "seeds": "0",
    }
)


def test_the_builder_is_registered_under_its_profile_name() -> None:
    assert BUILDERS["twc_gold"] is twc_gold.build


def test_puts_and_opens_are_read_from_the_gold_actions() -> None:
    assert twc_gold.puts(GOLD) == [
        ("newspaper", "side table"),
        ("dirty mesh skimmer", "dishwasher"),
    ]
    # a door is not a container
    assert twc_gold.opened_containers(GOLD) == ["dishwasher", "kitchen cupboard"]


def test_where_put_asks_about_the_first_object_put_away() -> None:
    assert twc_gold.question(GOLD, "where-put") == (
        "Where did you put the newspaper?",
        "side table",
        "query:where-put",
    )


def test_where_put_answers_where_the_object_was_put_last() -> None:
    moved = ("take mug", "put mug on shelf", "take mug", "put mug in cupboard")
    assert twc_gold.question(moved, "where-put")[1] == "cupboard"


def test_opened_asks_for_the_first_container_opened() -> None:
    assert twc_gold.question(GOLD, "opened") == (
        "Which container did you open first?",
        "dishwasher",
        "query:close-opened",
    )
    one = ("take mug", "open cupboard", "put mug in cupboard")
    assert twc_gold.question(one, "opened") == (
        "Which container did you open?",
        "cupboard",
        "query:close-opened",
    )


def test_opened_falls_back_to_where_put_when_nothing_was_opened() -> None:
    plain = ("take mug", "put mug on shelf")
    assert twc_gold.question(plain, "opened") == (
        "Where did you put the mug?",
        "shelf",
        "query:where-put",
    )


def test_a_gold_path_that_puts_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="puts no object away"):
        twc_gold.question(("look around",), "where-put")


def test_tags_name_containers_doors_rooms_objects_and_query() -> None:
    assert twc_gold.scenario_tags(SPEC, GOLD, "query:where-put") == [
        "query:where-put",
        "container:closed",
        "doors",
        "rooms:2",
        "objects:2",
    ]
    bare = parse_env_spec({**{"backend": "textworld_express", "game": "twc"}, "seeds": 0})
    assert twc_gold.scenario_tags(bare, ("take a", "put a in b"), "query:where-put") == [
        "query:where-put",
        "rooms:1",
        "objects:1",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seeds": "0", "colour": "red"}, "unknown option.*colour"),
        ({"seeds": "0", "query": "why"}, "'query' must be one of"),
        ({"seeds": "0", "game": "cookingworld"}, "only the game 'twc'"),
        ({"seeds": "3-1"}, r"twc_gold\.seeds: the range '3-1' runs backwards"),
        ({}, "missing required key.*seeds"),
        ({"seeds": "0", "params": "numLocations"}, r"twc_gold\.params"),
    ],
)
def test_bad_options_are_one_message_naming_the_option(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        twc_gold.gold_spec(options)
