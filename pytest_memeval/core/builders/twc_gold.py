"""TextWorld Express gold-path builder: the environment's gold episodes -> benchmark records.

Options come from a TOML table such as::

    {builder = "twc_gold", params = "numLocations=2,numItemsToPutAway=2,includeDoors=1",
     fold = "test", seeds = "0-9", query = "where-put"}

``params``, ``fold`` and ``seeds`` are read as the ``env`` table reads them
(:func:`pytest_memeval.env.parse_env_spec`), so a profile can evaluate the same seeds
teacher-forced (this builder), free-running and closed-loop (its ``env`` table). ``game`` is
``twc`` (the only game whose gold path this builder knows how to question).

Each seed becomes one scenario, id ``twc-<seed>``, the id of that seed's closed-loop episode
(one benchmark is one fold: the fold is in each scenario's ``meta``), so runs of the same
seeds pair by id:

* the system message is the task description;
* the first user message is the observation after ``reset``;
* per gold action: the action as the assistant turn, the observation it produced as the next
  user message (the last one is followed by the question, in the same user message, so that
  roles alternate);
* the final assistant message is the answer to the question.

The question (``query``):

* ``where-put`` (default): ``Where did you put the <object>?`` about the object of the gold
  path's *first* ``put X in/on Y`` (the one furthest back); the answer is where the path put
  ``X`` last (the gold path puts each object once), which is where the final state has it.
* ``opened``: where the gold path opened a container (``open X``, not ``open door to ...``),
  ``Which container did you open?`` (``Which container did you open first?`` when it opened
  several); the answer is that container. The gold path never closes anything, so it is
  still open in the final state. A seed that opened no container gets the ``where-put``
  question, so the seed list (and ids) are the same for both queries.

Tags: ``query:where-put`` / ``query:close-opened``; ``container:closed`` when the gold path
opened a container (one was closed and had to be opened); ``doors`` when ``includeDoors`` is
on; ``rooms:N`` (``numLocations``, TextWorld Express's default 1 when absent); ``objects:N``
(the number of objects the gold path put away). ``meta`` holds ``game``, ``fold``, ``seed``,
``params`` and ``gold_actions`` (the count).

The environment (one JVM) is closed before the records are returned. Standard library plus
the ``env`` package; a missing ``textworld-express`` or Java is one error saying what to
install (from the environment's own setup check).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_memeval.env import EnvSetupError, EnvSpec, TextEnv, make_env, parse_env_spec

__all__ = [
    "QUERIES",
    "GoldEpisode",
    "build",
    "gold_spec",
    "opened_containers",
    "play_gold",
    "puts",
    "question",
    "render_record",
    "scenario_tags",
]

#: the kinds of final question (option ``query``)
QUERIES = ("where-put", "opened")
_GAME = "twc"
_OPTIONS = ("builder", "game", "params", "fold", "seeds", "query")
_PUT = re.compile(r"^put (?P<obj>.+?) (?:in|on) (?P<place>.+)$")
_OPEN = re.compile(r"^open (?P<container>.+)$")


@dataclass(frozen=True)
class GoldEpisode:
    """One seed's gold episode: what the environment said and what the gold path did."""

    fold: str
    seed: int
    task: str
    first_observation: str
    actions: tuple[str, ...]
    #: the observation each gold action produced (as many as ``actions``)
    observations: tuple[str, ...]
    success: bool


def puts(actions: Sequence[str]) -> list[tuple[str, str]]:
    """``(object, place)`` of each ``put X in Y`` / ``put X on Y`` action, in order."""
    found = []
    for action in actions:
        match = _PUT.match(action)
        if match is not None:
            found.append((match["obj"], match["place"]))
    return found


def opened_containers(actions: Sequence[str]) -> list[str]:
    """The containers the actions open, in order (doors, ``open door to ...``, are not)."""
    opened = []
    for action in actions:
        match = _OPEN.match(action)
        if match is not None and not match["container"].startswith("door "):
            opened.append(match["container"])
    return opened


def question(actions: Sequence[str], query: str) -> tuple[str, str, str]:
    """``(question, answer, query tag)`` for a gold path; ``ValueError`` if it puts nothing."""
    opened = opened_containers(actions)
    if query == "opened" and opened:
        first = "first" if len(opened) > 1 else ""
        text = f"Which container did you open{' ' + first if first else ''}?"
        return text, opened[0], "query:close-opened"
    put = puts(actions)
    if not put:
        raise ValueError(f"the gold path puts no object away: {list(actions)}")
    obj = put[0][0]
    # where the object was put last: its place in the final state
    place = [where for what, where in put if what == obj][-1]
    return f"Where did you put the {obj}?", place, "query:where-put"


def scenario_tags(spec: EnvSpec, actions: Sequence[str], query_tag: str) -> list[str]:
    """The slices of a scenario (see the module docstring)."""
    params = dict(spec.params)
    tags = [query_tag]
    if opened_containers(actions):
        tags.append("container:closed")
    if int(params.get("includeDoors", 0)):
        tags.append("doors")
    tags.append(f"rooms:{params.get('numLocations', 1)}")
    tags.append(f"objects:{len({obj for obj, _ in puts(actions)})}")
    return tags


def render_record(spec: EnvSpec, episode: GoldEpisode, query: str) -> dict[str, Any]:
    """One gold episode as a benchmark record, with its ``tags`` and ``meta``."""
    text, answer, query_tag = question(episode.actions, query)
    messages: list[dict[str, str]] = [
        {"role": "system", "content": episode.task},
        {"role": "user", "content": episode.first_observation},
    ]
    for action, observation in zip(episode.actions, episode.observations, strict=True):
        messages.append({"role": "assistant", "content": action})
        messages.append({"role": "user", "content": observation})
    messages[-1] = {"role": "user", "content": f"{messages[-1]['content']}\n\n{text}"}
    messages.append({"role": "assistant", "content": answer})
    return {
        "id": f"twc-{episode.seed}",
        "messages": messages,
        "tags": scenario_tags(spec, episode.actions, query_tag),
        "meta": {
            "game": spec.game,
            "fold": episode.fold,
            "seed": episode.seed,
            "params": spec.params_text,
            "gold_actions": len(episode.actions),
        },
    }


def play_gold(env: TextEnv, fold: str, seed: int) -> GoldEpisode:
    """Reset ``env`` to ``seed`` with its gold path and play that path through."""
    gold_actions = getattr(env, "gold_actions", None)
    if not callable(gold_actions):
        raise ValueError(f"twc_gold: the environment {type(env).__name__} has no gold path")
    observation, info = env.reset(seed, {"gold_path": True})
    actions = tuple(str(a) for a in gold_actions())
    observations = []
    success = bool(info.success)
    for action in actions:
        result = env.step(action)
        observations.append(result.observation.strip())
        success = bool(result.info.success)
    return GoldEpisode(
        fold=fold,
        seed=seed,
        task=(info.task_description or "").strip(),
        first_observation=observation.strip(),
        actions=actions,
        observations=tuple(observations),
        success=success,
    )


def gold_spec(options: Mapping[str, Any]) -> tuple[EnvSpec, str]:
    """The env spec and query of an options table (``ValueError`` naming the option)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(
            f"twc_gold: unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})"
        )
    query = options.get("query", "where-put")
    if query not in QUERIES:
        raise ValueError(f"twc_gold: option 'query' must be one of {QUERIES}, got {query!r}")
    game = options.get("game", _GAME)
    if game != _GAME:
        raise ValueError(f"twc_gold: only the game {_GAME!r} is supported, got {game!r}")
    table = {"backend": "textworld_express", "game": game, "fold": options.get("fold", "test")}
    table.update({k: options[k] for k in ("params", "seeds") if k in options})
    return parse_env_spec(table, "twc_gold"), str(query)


def build(options: Mapping[str, Any], rootdir: Path) -> Iterator[dict[str, Any]]:
    """Build one record per seed from the environment's gold paths (``rootdir`` unused).

    Every seed is played before the first record is returned; the environment is closed
    whatever happens. A gold path that does not end in success is an error naming the seed.
    """
    spec, query = gold_spec(options)
    fold = spec.fold or "test"
    try:
        env = make_env(spec)
    except EnvSetupError as exc:
        raise ValueError(str(exc)) from None
    try:
        episodes = [play_gold(env, fold, seed) for seed in spec.seeds]
    finally:
        env.close()
    failed = [e.seed for e in episodes if not e.success]
    if failed:
        raise ValueError(f"twc_gold: the gold path of seed(s) {failed} does not succeed")
    return iter([render_record(spec, e, query) for e in episodes])
