"""Plain-data records that flow between the stages, and the one check of their schema.

* decoder outputs: :class:`TurnOutput`, :class:`Rollout`;
* the per-scenario record (one line of ``predictions.jsonl``, built by
  :func:`pytest_memeval.core.scoring.score`): :class:`Record` with its :class:`Turn` entries;
* the metrics document (``metrics.json``): :class:`Metrics` with its blocks;
* a line of a predictions file to replay (``kind = "replay"``): :class:`Prediction`.

Every field is documented in ``docs/results-schema.md`` (version :data:`SCHEMA_VERSION`).
JSON read from disk is checked once, here, by :func:`validate_record`,
:func:`validate_metrics` and :func:`validate_prediction`, whose field checks are derived from
the TypedDicts below (the schema is stated once): each raises :class:`RecordError`
naming the place (file:line, scenario), the field and what is wrong, or returns the object
typed, so readers index it without further ``isinstance`` checks and a reader's ``KeyError``
or ``TypeError`` is a bug, never bad input.

This module carries no behaviour beyond the checks and imports nothing heavy, so every stage
(scoring in ``core``, the decoders, the runtime, the tools) can share it.
"""

from __future__ import annotations

import json
import types
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Literal,
    Protocol,
    TypedDict,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from pytest_memeval.core.formatting import shorten
from pytest_memeval.core.history import HISTORIES, HISTORY_TRUTH
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY
from pytest_memeval.core.tags import check_tags, meta_problem, tag_problem

__all__ = [
    "SCHEMA_VERSION",
    "Counts",
    "Fingerprints",
    "LeftTruth",
    "Metrics",
    "Overlong",
    "ParseFailCounts",
    "Prediction",
    "PredictionTurn",
    "RateBlock",
    "Record",
    "RecordError",
    "Rollout",
    "ShardScope",
    "SliceBlock",
    "Turn",
    "TurnOutput",
    "read_records",
    "validate_metrics",
    "validate_prediction",
    "validate_record",
    "validate_shard_scope",
]

#: Version of the results schema (``predictions.jsonl`` records and ``metrics.json``'s
#: ``schema_version``); bump on any incompatible change (docs/results-schema.md).
SCHEMA_VERSION = 1

#: How a turn is scored: against ``memory_chain[i]``, the message itself (no chain), or not
#: at all (the turn count differs from the chain).
GRANULARITIES = ("memory_chain", "message", "unaligned")
#: ``stop_flags`` of metrics.json (see :func:`pytest_memeval.core.metrics.stop_flags_kind`).
STOP_FLAGS = ("present", "absent", "mixed")


# -- decoder outputs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnOutput:
    """What the model produced for one assistant message.

    ``text`` is the decoded output without the stop token; ``stopped`` is False when
    generation ran into ``max_new_tokens`` (a parse failure), and ``None`` when it is not
    known (replayed predictions of another harness, which records no stop flags);
    ``generated`` is True when the output is not the teacher-forced truth: the model left the
    truth, and a ``generate`` call or the fast path's verification pass decided the rest
    (which of the two depends on how turns were pooled, so the record does not say).
    """

    text: str
    stopped: bool | None
    generated: bool = True


@dataclass(frozen=True)
class Rollout:
    """One output per assistant message of a scenario, in order; the last is the final answer."""

    outputs: tuple[TurnOutput, ...]
    path: str
    prompt_tail: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: scenarios in the forward pass that decoded this one, and the decoder's most per pass
    #: (0, 0: not decoded by a batched pass, e.g. the reference path)
    batch: int = 0
    batch_size: int = 0
    #: what the prompts held as earlier assistant messages: ``truth`` (teacher-forced) or
    #: ``model`` (free-running: the earlier outputs, each as ``history.fed_back`` makes it)
    history: str = HISTORY_TRUTH


# -- the per-scenario record (predictions.jsonl) -----------------------------------------------


class Turn(TypedDict):
    """One non-final assistant turn of a :class:`Record`."""

    index: int
    message_index: int
    pred: str
    gt: str | None
    target: str
    match: bool | None
    parse_fail: bool
    stopped: bool | None
    granularity: str
    generated: bool


class Overlong(TypedDict):
    """``overlong`` of a record evaluated past the model's context on request."""

    tokens: int
    limit: int


class _RecordFields(TypedDict):
    id: str
    index: int
    final_pred: str
    final_gt: str
    final_match: bool
    parse_fail: bool
    parse_fail_reason: str | None
    final_stopped: bool | None
    aligned: bool
    n_turns: int
    n_memory_chain: int | None
    turns: list[Turn]
    decode: str
    prompt_tail: str


class Record(_RecordFields, total=False):
    """One line of ``predictions.jsonl``: what :func:`~pytest_memeval.core.scoring.score`
    builds, plus the context the runtime adds (``worker``, ``device``, ``decode_s``, the
    batch fields) and the optional ``notes`` and ``overlong``; ``tags`` and ``meta`` where
    the benchmark gives them (:mod:`pytest_memeval.core.tags`). ``history``,
    ``left_truth_at`` and ``still_right_after`` are in every record written since
    free-running runs exist (older records lack them: teacher-forced, facts unknown)."""

    history: str
    left_truth_at: int | None
    still_right_after: int | None
    tags: list[str]
    meta: dict[str, object]
    worker: str
    device: str
    decode_s: float
    notes: list[str]
    overlong: Overlong
    decode_batch: int
    decode_batch_size: int


# -- the metrics document (metrics.json) ----------------------------------------------------


class _RateCounts(TypedDict):
    correct: int
    total: int
    rate: float | None


class RateBlock(_RateCounts, total=False):
    """``m1`` / ``m2``: the counts, the rate (null when nothing was scored) and, in runs
    written since intervals exist, the 95% interval (``clusters``: m2 only)."""

    ci95: list[float] | None
    ci95_method: str | None
    clusters: int


class SliceBlock(TypedDict):
    """One entry of ``slices`` in metrics.json: the scenarios that carry one tag.

    ``m1`` and ``m2`` as the run's own blocks (Wilson interval; interval clustered by
    scenario, over the slice's aligned scenarios); ``m1_mde_pp`` the smallest m1 difference
    ``n`` paired scenarios can detect at best (80% power, alpha 0.05; null below 6)."""

    n: int
    m1: RateBlock
    m2: RateBlock
    unaligned: int
    m1_mde_pp: float | None


class ParseFailCounts(TypedDict):
    """``parse_fail`` of metrics.json: unparseable final answers and turns."""

    final: int
    turns: int


class PositionCounts(TypedDict):
    """One entry of ``m2_by_position``."""

    correct: int
    total: int


class LeftTruth(TypedDict):
    """``left_truth`` of metrics.json: where the scenarios first left the truth.

    ``at``: turn index -> scenarios whose first turn that is not the true message is that
    one (``left_truth_at``); ``never``: scenarios that reproduced every turn; ``still_right``:
    over the aligned scenarios that left it, the turns after that first departure and how
    many of them were right (``still_right_after``). Counted over the records that carry
    the facts (every record of a run written since they exist)."""

    at: dict[str, int]
    never: int
    still_right: PositionCounts


class Fingerprints(TypedDict, total=False):
    """``fingerprints`` of metrics.json (``sha256:`` hashes; null where there is nothing)."""

    benchmark: str | None
    model: str | None
    adapter: str | None
    decoding: str | None
    #: only when the profile names a ``tokenizer`` directory
    tokenizer: str | None


class _CountFields(TypedDict):
    n: int
    m1: RateBlock
    m2: RateBlock
    unaligned: int
    parse_fail: ParseFailCounts


class Counts(_CountFields, total=False):
    """The count fields of ``metrics.json``: what the aggregate
    (:meth:`pytest_memeval.core.metrics.Tally.counts`) and the recount
    (:func:`pytest_memeval.core.recount.recount_file`) compute and must agree on.
    ``stop_flags``, ``overlong``, ``slices`` and ``left_truth`` came later: older metrics
    lack them. ``histories`` (records per history) is no field of metrics.json: it is
    checked against the one ``history`` the metrics claim."""

    stop_flags: str
    overlong: int
    slices: dict[str, SliceBlock]
    left_truth: LeftTruth
    histories: dict[str, int]


class _MetricsFields(_CountFields):
    schema_version: int
    ckpt: str
    kind: str
    complete: bool
    scope: dict[str, object]
    missing: list[str]
    not_selected: list[str]


class ShardScope(TypedDict):
    """``scope.shard`` of a shard run's ``metrics.json``: which slice of the benchmark it
    covers (written by :func:`pytest_memeval.core.sharding.shard_scope`; ``null`` in any
    other run). ``start``/``stop`` are 0-based positions, ``stop`` exclusive; ``first`` and
    ``last`` are ``null`` for an empty shard."""

    spec: str
    index: int
    count: int
    start: int
    stop: int
    size: int
    first: str | None
    last: str | None
    benchmark_total: int


class Metrics(_MetricsFields, total=False):
    """``metrics.json`` (docs/results-schema.md). The required fields are those
    :func:`validate_metrics` requires; the others came later (readers default
    ``stop_flags`` to ``present`` and ``overlong`` to 0), are not in every hand-made run,
    or belong to some writers only (``overrides``, ``merged_from``)."""

    stop_flags: str
    overlong: int
    slices: dict[str, SliceBlock]
    history: str
    left_truth: LeftTruth
    m2_by_position: dict[str, PositionCounts]
    generated_turns: int
    fingerprints: Fingerprints
    decoding: dict[str, object]
    benchmark: dict[str, object] | None
    predictions_sha256: str
    timing: dict[str, object]
    created: str
    overrides: dict[str, object]
    merged_from: list[dict[str, object]]


# -- a line of a predictions file to replay ----------------------------------------------------


class PredictionTurn(TypedDict):
    """One turn of a :class:`Prediction`: the text and its stop flag (None: not given)."""

    pred: str
    stopped: bool | None


class Prediction(TypedDict):
    """A replay line, normalised: stop flags are None where the line has none, and
    ``prompt_tail`` is ``""`` unless the line has a string there."""

    id: str
    final_pred: str
    final_stopped: bool | None
    turns: list[PredictionTurn]
    prompt_tail: str


# -- the checks ------------------------------------------------------------------------------


class RecordError(ValueError):
    """A record, metrics document or prediction line does not follow the schema.

    ``str(error)`` is ``"<where>: <problem>"``; ``where`` names the place (``file:line``,
    then ``scenario 'id'`` once the id is known), ``field`` the offending field (a path such
    as ``turns[2].match``, or None when the object itself is wrong) and ``problem`` what is
    wrong with it. ``scenario`` is the record's id when it could be read.
    """

    def __init__(
        self, where: str, field: str | None, problem: str, scenario: str | None = None
    ) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.field = field
        self.problem = problem
        self.scenario = scenario


_Kind = Literal["str", "int", "number", "bool", "list", "object"]
_KIND_NAMES: dict[_Kind, str] = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "list": "a list",
    "object": "a JSON object",
}
#: The exact Python types ``json.loads`` makes for each kind: the fast path of the check
#: (one set lookup per field; it runs on every turn of every record a reader loads).
_JSON_TYPES: dict[_Kind, frozenset[type]] = {
    "str": frozenset({str}),
    "int": frozenset({int}),
    "number": frozenset({int, float}),
    "bool": frozenset({bool}),
    "list": frozenset({list}),
    "object": frozenset({dict}),
}
#: (field, kind, nullable, the types that pass at once)
_Spec = tuple[str, _Kind, bool, frozenset[type]]


class _Schema(Protocol):
    """A TypedDict class, as the specs below read it."""

    __required_keys__: frozenset[str]
    __optional_keys__: frozenset[str]


def _specs(*fields: tuple[str, _Kind, bool]) -> tuple[_Spec, ...]:
    """Field specs ``(name, kind, nullable)`` with their fast-path types."""
    return tuple(
        (name, kind, nullable, _JSON_TYPES[kind] | ({type(None)} if nullable else set()))
        for name, kind, nullable in fields
    )


#: The JSON kind of each Python type a field may be annotated with.
_KIND_OF_TYPE: dict[type, _Kind] = {
    str: "str",
    int: "int",
    float: "number",
    bool: "bool",
    list: "list",
    dict: "object",
}


def _kind_of(hint: object, where: str) -> tuple[_Kind, bool]:
    """``(kind, nullable)`` of a field annotated ``hint``: ``X | None`` is nullable, a
    TypedDict or ``dict[...]`` is an object, ``list[...]`` a list."""
    nullable = False
    if get_origin(hint) in (Union, types.UnionType):
        members = [a for a in get_args(hint) if a is not type(None)]
        nullable = len(members) < len(get_args(hint))
        if len(members) != 1:
            raise TypeError(f"{where}: a field is one JSON type or null, not {hint}")
        hint = members[0]
    if is_typeddict(hint):
        return "object", nullable
    kind = _KIND_OF_TYPE.get(cast(type, get_origin(hint) or hint))
    if kind is None:
        raise TypeError(f"{where}: no JSON kind for {hint} (add it to _KIND_OF_TYPE)")
    return kind, nullable


def _fields_of(schema: _Schema, *, required: bool, skip: Collection[str] = ()) -> tuple[_Spec, ...]:
    """The specs of ``schema``'s required (or optional) fields, in declaration order: the
    validators check exactly what the TypedDicts above declare, so the two cannot drift."""
    keys = schema.__required_keys__ if required else schema.__optional_keys__
    hints = get_type_hints(schema)
    return _specs(
        *(
            (name, *_kind_of(hint, f"{getattr(schema, '__name__', schema)}.{name}"))
            for name, hint in hints.items()
            if name in keys and name not in skip
        )
    )


#: Every field is checked, except ``id``: read first, so that errors can name the scenario.
_RECORD_REQUIRED = _fields_of(Record, required=True, skip=("id",))
_RECORD_OPTIONAL = _fields_of(Record, required=False)
_TURN_REQUIRED = _fields_of(Turn, required=True)
_OVERLONG = _fields_of(Overlong, required=True)
_PARSE_FAIL = _fields_of(ParseFailCounts, required=True)
_FINGERPRINTS = _fields_of(Fingerprints, required=False)
_RATE_REQUIRED = _fields_of(RateBlock, required=True)
_RATE_OPTIONAL = _fields_of(RateBlock, required=False)
#: The count fields are required even of a ``counts_only`` read; the other required fields
#: of ``metrics.json`` are not.
_COUNTS_REQUIRED = _fields_of(_CountFields, required=True)
_METRICS_REQUIRED = _fields_of(Metrics, required=True, skip=_CountFields.__required_keys__)
_METRICS_OPTIONAL = _fields_of(Metrics, required=False)
_SLICE = _fields_of(SliceBlock, required=True)
_LEFT_TRUTH = _fields_of(LeftTruth, required=True)
_COUNT_PAIR = _fields_of(PositionCounts, required=True)
_SHARD_SCOPE = _fields_of(ShardScope, required=True)


def _is(value: object, kind: _Kind) -> bool:
    # bool is an int subclass in Python, but true is not a count in JSON.
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def _shown(value: object) -> str:
    """``value`` as the file spells it (JSON), shortened for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data: a record built in Python
        text = repr(value)
    return shorten(text, 60)


class _Checker:
    """Checks the fields of one JSON object; every error names ``where`` and the field."""

    def __init__(self, where: str, scenario: str | None = None) -> None:
        self.where = where
        self.scenario = scenario

    def fail(self, name: str | None, problem: str) -> RecordError:
        return RecordError(self.where, name, problem, self.scenario)

    def obj(self, value: object, name: str | None, hint: str = "") -> dict[str, object]:
        if not isinstance(value, dict):
            if name is None:
                raise self.fail(None, f"not a JSON object{hint}, got {_shown(value)}")
            raise self.fail(name, f"field {name!r} must be a JSON object, got {_shown(value)}")
        return cast("dict[str, object]", value)

    def fields(
        self,
        obj: Mapping[str, object],
        specs: tuple[_Spec, ...],
        *,
        prefix: str = "",
        required: bool = True,
    ) -> None:
        for key, kind, nullable, fast in specs:
            if key not in obj:
                if required:
                    raise self.fail(prefix + key, f"missing field {prefix + key!r}")
                continue
            value = obj[key]
            if type(value) in fast or _is(value, kind):
                continue  # _is: subclasses, in records built in Python rather than read
            name = prefix + key
            null = " or null" if nullable else ""
            raise self.fail(
                name, f"field {name!r} must be {_KIND_NAMES[kind]}{null}, got {_shown(value)}"
            )

    def strings(self, value: object, name: str) -> None:
        assert isinstance(value, list)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(
                    f"{name}[{i}]", f"field '{name}[{i}]' must be a string, got {_shown(item)}"
                )

    def flag(self, value: object, name: str) -> bool | None:
        """A stop flag of a prediction line: true, false, or absent (missing or null)."""
        if value is None or isinstance(value, bool):
            return value
        raise self.fail(name, f"field {name!r} must be true, false or absent, got {_shown(value)}")


def _record_id(obj: Mapping[str, object], where: str) -> _Checker:
    """Check ``id`` and return a checker whose place names the scenario."""
    check = _Checker(where)
    if "id" not in obj:
        raise check.fail("id", "missing field 'id'")
    sid = obj["id"]
    if not isinstance(sid, str):
        raise check.fail("id", f"field 'id' must be a string, got {_shown(sid)}")
    return _Checker(f"{where}: scenario {sid!r}", sid)


def validate_record(obj: object, where: str) -> Record:
    """Check one scenario record (a line of ``predictions.jsonl`` or ``journal.jsonl``).

    ``where`` names the place, e.g. ``"runs/x/predictions.jsonl:12"``; errors add the
    scenario id once it is known. Checked: every field :func:`~.scoring.score` writes is
    present with its type (the runtime's context fields, ``notes`` and ``overlong`` only
    when present), and the values agree with one another: ``n_turns`` is the number of
    turns and each turn's ``index`` its position; a turn's ``match`` is null exactly when
    its ``gt`` is (an unscored turn); a parse failure never matches and has a reason;
    ``aligned`` agrees with ``n_memory_chain`` and the turns' ``granularity``.

    Returns ``obj`` itself, typed; raises :class:`RecordError`.
    """
    record = _Checker(where).obj(obj, None)
    check = _record_id(record, where)
    check.fields(record, _RECORD_REQUIRED)
    check.fields(record, _RECORD_OPTIONAL, required=False)
    if "tags" in record:
        try:
            check_tags(record["tags"])
        except ValueError as exc:
            raise check.fail("tags", str(exc)) from None
    if "meta" in record and (problem := meta_problem(record["meta"])) is not None:
        raise check.fail("meta", problem)
    if "notes" in record:
        check.strings(record["notes"], "notes")
    if "overlong" in record:
        check.fields(
            check.obj(record["overlong"], "overlong"),
            _OVERLONG,
            prefix="overlong.",
        )
    if record["parse_fail"] is True and record["final_match"] is True:
        raise check.fail(
            "final_match",
            "field 'final_match' is true but 'parse_fail' is true (a parse failure never matches)",
        )
    if (record["parse_fail_reason"] is None) == (record["parse_fail"] is True):
        state = "null" if record["parse_fail_reason"] is None else "given"
        raise check.fail(
            "parse_fail_reason",
            f"field 'parse_fail_reason' is {state} but 'parse_fail' is "
            f"{str(record['parse_fail']).lower()} (a reason is given exactly for a parse failure)",
        )
    turns = record["turns"]
    assert isinstance(turns, list)
    if record["n_turns"] != len(turns):
        raise check.fail(
            "n_turns",
            f"field 'n_turns' is {record['n_turns']}, but 'turns' has {len(turns)} entries",
        )
    chain = record["n_memory_chain"]
    aligned = chain is None or chain == record["n_turns"]
    if record["aligned"] is not aligned:
        raise check.fail(
            "aligned",
            f"field 'aligned' is {str(record['aligned']).lower()}, but 'n_memory_chain' is "
            f"{_shown(chain)} and 'n_turns' {record['n_turns']} (aligned: no chain, or one "
            "entry per turn)",
        )
    for i, value in enumerate(turns):
        _check_turn(check, check.obj(value, f"turns[{i}]"), i, aligned=aligned)
    _check_history_facts(check, record, aligned=aligned)
    return cast(Record, record)


def _check_history_facts(check: _Checker, record: dict[str, object], *, aligned: bool) -> None:
    """``history`` one of :data:`~.history.HISTORIES`; ``left_truth_at`` and
    ``still_right_after`` given together, in range, and ``still_right_after`` null exactly
    where there is nothing to count (never left the truth, or unaligned). Whether they agree
    with the turns is the recount's check (:mod:`.recount`)."""
    if "history" in record and record["history"] not in HISTORIES:
        raise check.fail(
            "history",
            f"field 'history' must be one of {', '.join(HISTORIES)}, got "
            f"{_shown(record['history'])}",
        )
    given = [key for key in ("left_truth_at", "still_right_after") if key in record]
    if len(given) == 1:
        other = "still_right_after" if given[0] == "left_truth_at" else "left_truth_at"
        raise check.fail(other, f"missing field {other!r} (given with {given[0]!r})")
    if not given:
        return
    at, after, n = record["left_truth_at"], record["still_right_after"], record["n_turns"]
    assert isinstance(n, int)
    if at is not None and not 0 <= cast(int, at) < n:
        raise check.fail(
            "left_truth_at",
            f"field 'left_truth_at' is {at}, but the record has {n} turn(s) (a turn index, or "
            "null when the model never left the truth)",
        )
    if (after is None) != (at is None or not aligned):
        state = "null" if after is None else "given"
        raise check.fail(
            "still_right_after",
            f"field 'still_right_after' is {state}, but 'left_truth_at' is {_shown(at)} and "
            f"'aligned' {str(aligned).lower()} (a count exactly where an aligned scenario "
            "left the truth)",
        )
    if after is not None and not 0 <= cast(int, after) <= n - cast(int, at) - 1:
        raise check.fail(
            "still_right_after",
            f"field 'still_right_after' is {after}, but only {n - cast(int, at) - 1} turn(s) "
            "follow 'left_truth_at'",
        )


def _check_turn(check: _Checker, turn: dict[str, object], i: int, *, aligned: bool) -> None:
    p = f"turns[{i}]."
    check.fields(turn, _TURN_REQUIRED, prefix=p)
    if turn["index"] != i:
        raise check.fail(f"{p}index", f"field '{p}index' is {turn['index']}, expected {i}")
    if turn["granularity"] not in GRANULARITIES:
        raise check.fail(
            f"{p}granularity",
            f"field '{p}granularity' must be one of {', '.join(GRANULARITIES)}, got "
            f"{_shown(turn['granularity'])}",
        )
    if (turn["granularity"] == "unaligned") == aligned:
        raise check.fail(
            f"{p}granularity",
            f"field '{p}granularity' is {_shown(turn['granularity'])}, but 'aligned' is "
            f"{str(aligned).lower()}",
        )
    if (turn["match"] is None) != (turn["gt"] is None):
        state = "null" if turn["match"] is None else str(turn["match"]).lower()
        gt = "null" if turn["gt"] is None else "given"
        raise check.fail(
            f"{p}match",
            f"field '{p}match' is {state} but '{p}gt' is {gt} (a turn is scored exactly when "
            "it has a ground truth)",
        )
    if turn["parse_fail"] is True and turn["match"] is True:
        raise check.fail(
            f"{p}match",
            f"field '{p}match' is true but '{p}parse_fail' is true (a parse failure never matches)",
        )


def validate_metrics(obj: object, where: str, *, counts_only: bool = False) -> Metrics:
    """Check a ``metrics.json`` document of schema :data:`SCHEMA_VERSION`.

    ``where`` names the file. Checked: a JSON object, of this schema version when it says;
    the count fields (``n``, ``m1``, ``m2``, ``unaligned``, ``parse_fail``, with their
    inner fields) and ``schema_version``, ``ckpt``, ``kind``, ``complete``, ``scope``,
    ``missing``, ``not_selected`` present with their types; every other documented field
    typed where present, ``stop_flags`` one of ``present``, ``absent``, ``mixed``;
    ``missing``/``not_selected`` lists of ids; ``m1.total == n``. Whether the counts agree
    with the predictions is the recount's job (:func:`pytest_memeval.core.recount.recount_run`).

    ``counts_only``: require only the count fields (the recount's own reading, which
    checks nothing else of the document's presence); the other fields are still typed
    where present.

    Returns ``obj`` itself, typed; raises :class:`RecordError`.
    """
    check = _Checker(where)
    doc = check.obj(obj, None, " (metrics.json is one object)")
    if "schema_version" in doc and doc["schema_version"] != SCHEMA_VERSION:
        raise check.fail(
            "schema_version",
            f"field 'schema_version' is {_shown(doc['schema_version'])}; this version of "
            f"pytest-memeval reads schema {SCHEMA_VERSION} (docs/results-schema.md)",
        )
    check.fields(doc, _COUNTS_REQUIRED)
    check.fields(doc, _METRICS_REQUIRED, required=not counts_only)
    check.fields(doc, _METRICS_OPTIONAL, required=False)
    for block in ("m1", "m2"):
        _check_rates(check, doc[block], block)
    if "slices" in doc:
        _check_slices(check, cast("dict[str, object]", doc["slices"]))
    check.fields(
        check.obj(doc["parse_fail"], "parse_fail"),
        _PARSE_FAIL,
        prefix="parse_fail.",
    )
    if "fingerprints" in doc:
        check.fields(
            cast("dict[str, object]", doc["fingerprints"]),
            _FINGERPRINTS,
            prefix="fingerprints.",
            required=False,
        )
    for ids in ("missing", "not_selected"):
        if ids in doc:
            check.strings(doc[ids], ids)
    if "history" in doc and doc["history"] not in HISTORIES:
        raise check.fail(
            "history",
            f"field 'history' must be one of {', '.join(HISTORIES)}, got {_shown(doc['history'])}",
        )
    if "left_truth" in doc:
        _check_left_truth(check, doc["left_truth"])
    if "stop_flags" in doc and doc["stop_flags"] not in STOP_FLAGS:
        raise check.fail(
            "stop_flags",
            f"field 'stop_flags' must be one of {', '.join(STOP_FLAGS)}, got "
            f"{_shown(doc['stop_flags'])}",
        )
    m1 = cast("dict[str, object]", doc["m1"])
    if m1["total"] != doc["n"]:
        raise check.fail("m1.total", f"field 'm1.total' is {m1['total']}, but 'n' is {doc['n']}")
    return cast(Metrics, doc)


def _check_rates(check: _Checker, value: object, name: str) -> None:
    """An ``m1``/``m2`` block: the counts and rate, the interval fields where present."""
    rates = check.obj(value, name)
    check.fields(rates, _RATE_REQUIRED, prefix=f"{name}.")
    check.fields(rates, _RATE_OPTIONAL, prefix=f"{name}.", required=False)


def _check_left_truth(check: _Checker, value: object) -> None:
    """``left_truth``: ``at`` (turn index -> count), ``never`` and ``still_right``."""
    block = check.obj(value, "left_truth")
    check.fields(block, _LEFT_TRUTH, prefix="left_truth.")
    for key, count in cast("dict[str, object]", block["at"]).items():
        if not key.isdigit() or not _is(count, "int"):
            raise check.fail(
                "left_truth.at",
                f"field 'left_truth.at' maps turn indices to counts, got {_shown(key)}: "
                f"{_shown(count)}",
            )
    check.fields(
        check.obj(block["still_right"], "left_truth.still_right"),
        _COUNT_PAIR,
        prefix="left_truth.still_right.",
    )


def _check_slices(check: _Checker, slices: dict[str, object]) -> None:
    """``slices``: a valid tag -> one :class:`SliceBlock` each, ``m1.total == n``."""
    for tag, value in slices.items():
        where = f"slices[{tag!r}]"
        if (problem := tag_problem(tag)) is not None:
            raise check.fail("slices", f"field 'slices': {problem}")
        block = check.obj(value, where)
        check.fields(block, _SLICE, prefix=f"{where}.")
        for rates in ("m1", "m2"):
            _check_rates(check, block[rates], f"{where}.{rates}")
        total = cast("dict[str, object]", block["m1"])["total"]
        if total != block["n"]:
            raise check.fail(
                f"{where}.m1.total",
                f"field '{where}.m1.total' is {total}, but '{where}.n' is {block['n']}",
            )


def validate_shard_scope(obj: object, where: str) -> ShardScope:
    """Check ``scope.shard`` of a shard run's metrics (``where`` names the file): every field
    of :class:`ShardScope` present with its type. Only ``memeval merge`` reads the block, so
    :func:`validate_metrics` leaves it alone. Returns ``obj`` typed; raises
    :class:`RecordError`."""
    check = _Checker(where)
    shard = check.obj(obj, "scope.shard")
    check.fields(shard, _SHARD_SCOPE, prefix="scope.shard.")
    return cast(ShardScope, shard)


def validate_prediction(obj: object, where: str) -> Prediction:
    """Check one line of a predictions file to replay; return it normalised.

    The replay input format (docs/results-schema.md, "Replay input"): ``id`` (str),
    ``final_pred`` (str), ``turns`` (a list of ``{"pred": str}``); the stop flags
    ``final_stopped`` and each turn's ``stopped`` are true, false or absent (missing or
    null) and given on every output of the line or on none; ``prompt_tail`` is kept when it
    is a string; other fields are ignored. Whether the line fits its scenario (the number of
    turns) and the file (ids once, stop flags on every line or none) is the replay's check.

    Raises :class:`RecordError` (``where`` is the file and line).
    """
    line = _Checker(where).obj(obj, None, ' (a prediction line is {"id": ...})')
    check = _record_id(line, where)
    sid = cast(str, line["id"])
    if "final_pred" not in line:
        raise check.fail("final_pred", "missing field 'final_pred'")
    final = line["final_pred"]
    if not isinstance(final, str):
        raise check.fail("final_pred", f"field 'final_pred' must be a string, got {_shown(final)}")
    if "turns" not in line:
        raise check.fail("turns", "missing field 'turns' (a list of {\"pred\": ...}, one per turn)")
    raw_turns = line["turns"]
    if not isinstance(raw_turns, list):
        raise check.fail("turns", f"field 'turns' must be a list, got {type(raw_turns).__name__}")
    turns: list[PredictionTurn] = []
    for i, raw in enumerate(raw_turns):
        if not isinstance(raw, dict):
            raise check.fail(f"turns[{i}]", f"field 'turns[{i}]' must be an object with 'pred'")
        if "pred" not in raw:
            raise check.fail(f"turns[{i}].pred", f"missing field 'turns[{i}].pred'")
        pred = raw["pred"]
        if not isinstance(pred, str):
            raise check.fail(
                f"turns[{i}].pred", f"field 'turns[{i}].pred' must be a string, got {_shown(pred)}"
            )
        turns.append(
            {"pred": pred, "stopped": check.flag(raw.get("stopped"), f"turns[{i}].stopped")}
        )
    final_stopped = check.flag(line.get("final_stopped"), "final_stopped")
    names = [f"turns[{i}].stopped" for i in range(len(turns))] + ["final_stopped"]
    flags = [t["stopped"] for t in turns] + [final_stopped]
    given = [n for n, f in zip(names, flags, strict=True) if f is not None]
    if given and len(given) != len(names):
        lacking = next(n for n, f in zip(names, flags, strict=True) if f is None)
        raise check.fail(
            lacking,
            f"field {lacking!r} is missing while {given[0]!r} is given: a line carries the "
            "stop flags of all its outputs or of none",
        )
    tail = line.get("prompt_tail")
    return {
        "id": sid,
        "final_pred": final,
        "final_stopped": final_stopped,
        "turns": turns,
        "prompt_tail": tail if isinstance(tail, str) else "",
    }


def read_records(path: Path) -> Iterator[Record]:
    """Yield the checked records of a ``predictions.jsonl`` or ``journal.jsonl`` file.

    Blank lines and a journal's header line are skipped. A line that is not JSON, not a
    record (:func:`validate_record`), or a second record of the same scenario raises
    :class:`RecordError` naming ``path:line``; ``OSError`` and ``UnicodeDecodeError`` (an
    unreadable file) pass through to the caller.
    """
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(
                    where, None, f"malformed JSON ({exc.msg}, column {exc.colno})"
                ) from None
            if isinstance(obj, dict) and JOURNAL_HEADER_KEY in obj:
                continue
            record = validate_record(obj, where)
            sid = record["id"]
            if sid in first_line:
                raise RecordError(
                    f"{where}: scenario {sid!r}",
                    "id",
                    f"field 'id': the scenario appears twice (first on line {first_line[sid]})",
                    sid,
                )
            first_line[sid] = lineno
            yield record
