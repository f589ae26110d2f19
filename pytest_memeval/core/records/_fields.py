"""The field checks of the results schema, derived from its TypedDicts, and what applies them.

:func:`fields_of` reads a TypedDict class (:mod:`._types`, :mod:`._metrics`)
into :class:`FieldSpec` rows: each field's name, JSON kind and whether it may be null, so the
validators (:mod:`._validate`, :mod:`._validate_metrics`) check exactly what the types
declare and the schema is stated once. A :class:`Checker` applies the rows to one JSON
object; every problem it finds is a :class:`RecordError` naming the place, the field and
what is wrong.
"""

from __future__ import annotations

import json
import types
from collections.abc import Collection, Mapping
from typing import (
    Literal,
    NamedTuple,
    Protocol,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from pytest_memeval.core.formatting import shorten

__all__ = ["Checker", "FieldSpec", "JsonKind", "RecordError", "fields_of", "is_kind", "shown"]


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


JsonKind = Literal["str", "int", "number", "bool", "list", "object"]
_KIND_NAMES: dict[JsonKind, str] = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "list": "a list",
    "object": "a JSON object",
}
#: The exact Python types ``json.loads`` makes for each kind: the fast path of the check
#: (one set lookup per field; it runs on every turn of every record a reader loads).
_JSON_TYPES: dict[JsonKind, frozenset[type]] = {
    "str": frozenset({str}),
    "int": frozenset({int}),
    "number": frozenset({int, float}),
    "bool": frozenset({bool}),
    "list": frozenset({list}),
    "object": frozenset({dict}),
}


class FieldSpec(NamedTuple):
    """One field of a TypedDict as the checks read it, what :func:`fields_of` hands the
    validators."""

    name: str
    kind: JsonKind
    nullable: bool
    #: the types that pass at once (:data:`_JSON_TYPES` of ``kind``, and None if nullable)
    fast: frozenset[type]


class _Schema(Protocol):
    """A TypedDict class, as the specs below read it."""

    __required_keys__: frozenset[str]
    __optional_keys__: frozenset[str]


def _specs(*fields: tuple[str, JsonKind, bool]) -> tuple[FieldSpec, ...]:
    """Field specs ``(name, kind, nullable)`` with their fast-path types."""
    return tuple(
        FieldSpec(name, kind, nullable, _JSON_TYPES[kind] | ({type(None)} if nullable else set()))
        for name, kind, nullable in fields
    )


#: The JSON kind of each Python type a field may be annotated with.
_KIND_OF_TYPE: dict[type, JsonKind] = {
    str: "str",
    int: "int",
    float: "number",
    bool: "bool",
    list: "list",
    dict: "object",
}


def _kind_of(hint: object, where: str) -> tuple[JsonKind, bool]:
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


def fields_of(
    schema: _Schema, *, required: bool, skip: Collection[str] = ()
) -> tuple[FieldSpec, ...]:
    """The specs of ``schema``'s required (or optional) fields, in declaration order: the
    validators check exactly what the TypedDicts declare, so the two cannot drift."""
    keys = schema.__required_keys__ if required else schema.__optional_keys__
    hints = get_type_hints(schema)
    return _specs(
        *(
            (name, *_kind_of(hint, f"{getattr(schema, '__name__', schema)}.{name}"))
            for name, hint in hints.items()
            if name in keys and name not in skip
        )
    )


def is_kind(value: object, kind: JsonKind) -> bool:
    """Whether ``value`` is of JSON kind ``kind`` (subclasses too: the check's slow path)."""
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


def shown(value: object) -> str:
    """``value`` as the file spells it (JSON), shortened for a message."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data: a record built in Python
        text = repr(value)
    return shorten(text, 60)


class Checker:
    """Checks the fields of one JSON object; every error names ``where`` and the field."""

    def __init__(self, where: str, scenario: str | None = None) -> None:
        self.where = where
        self.scenario = scenario

    def fail(self, name: str | None, problem: str) -> RecordError:
        return RecordError(self.where, name, problem, self.scenario)

    def obj(self, value: object, name: str | None, hint: str = "") -> dict[str, object]:
        if not isinstance(value, dict):
            if name is None:
                raise self.fail(None, f"not a JSON object{hint}, got {shown(value)}")
            raise self.fail(name, f"field {name!r} must be a JSON object, got {shown(value)}")
        return cast("dict[str, object]", value)

    def fields(
        self,
        obj: Mapping[str, object],
        specs: tuple[FieldSpec, ...],
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
            if type(value) in fast or is_kind(value, kind):
                continue  # is_kind: subclasses, in records built in Python rather than read
            name = prefix + key
            null = " or null" if nullable else ""
            raise self.fail(
                name, f"field {name!r} must be {_KIND_NAMES[kind]}{null}, got {shown(value)}"
            )

    def strings(self, value: object, name: str) -> None:
        assert isinstance(value, list)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(
                    f"{name}[{i}]", f"field '{name}[{i}]' must be a string, got {shown(item)}"
                )

    def flag(self, value: object, name: str) -> bool | None:
        """A stop flag of a prediction line: true, false, or absent (missing or null)."""
        if value is None or isinstance(value, bool):
            return value
        raise self.fail(name, f"field {name!r} must be true, false or absent, got {shown(value)}")
