"""The results schema's one validator (core/records/) and the readers that use it.

``data/demo_oracle_subset`` is a real run of the bundled demo (``pytest contracts/test_eval.py
--ckpt oracle -k "s0001 or s0003 or s0005 or s0017"`` on CPU, its ``predictions.jsonl`` and
``metrics.json`` copied unchanged): one aligned and three unaligned scenarios, right and wrong
final answers, the fast path's batch fields.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from pytest_memeval.core.benchmark import parse_record
from pytest_memeval.core.matching import ParseRules
from pytest_memeval.core.metrics import METRICS_SCHEMA_VERSION, Tally
from pytest_memeval.core.records import (
    SCHEMA_VERSION,
    Fingerprints,
    Metrics,
    Overlong,
    ParseFailCounts,
    RateBlock,
    RecordError,
    Rollout,
    ShardScope,
    Turn,
    TurnOutput,
    read_records,
    validate_metrics,
    validate_prediction,
    validate_record,
    validate_shard_scope,
)
from pytest_memeval.core.records import Record as RecordSchema
from pytest_memeval.core.recount import RecountError, recount_run
from pytest_memeval.core.scoring import score
from pytest_memeval.tools.cli import main
from pytest_memeval.tools.gate import ExpectError, load_known_failures

DEMO_RUN = Path(__file__).parent / "data" / "demo_oracle_subset"
WHERE = "preds.jsonl:3"

Record = dict[str, Any]


def _demo_records() -> list[Record]:
    with (DEMO_RUN / "predictions.jsonl").open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _demo_metrics() -> dict[str, Any]:
    metrics: dict[str, Any] = json.loads((DEMO_RUN / "metrics.json").read_text("utf-8"))
    return metrics


ALIGNED = _demo_records()[0]  # s0001: 14 turns scored against the memory chain
UNALIGNED = _demo_records()[1]  # s0003: 6 turns, a chain of 7: recorded, not scored


# -- the schema is stated once -------------------------------------------------------------
# Every field a TypedDict of core/records/ declares is checked by its validator: a value of
# no JSON type at all, put in any declared field (required or optional), is refused naming
# exactly that field. A field added to a TypedDict that the validator did not check would
# pass here unnoticed; the validators' specs are derived from the TypedDicts, so none does.

NOT_JSON = object()
SHARD = {
    "spec": "1/2",
    "index": 1,
    "count": 2,
    "start": 0,
    "stop": 2,
    "size": 2,
    "first": "s0001",
    "last": "s0003",
    "benchmark_total": 4,
}


def _declared(schema: Any, prefix: str = "") -> list[str]:
    return [prefix + name for name in get_type_hints(schema)]


def _refused_field(check: Callable[[], object]) -> str | None:
    with pytest.raises(RecordError) as exc:
        check()
    return exc.value.field


def _put(doc: dict[str, Any], path: str, value: object) -> None:
    *parents, name = path.replace("turns[0]", "turns.0").split(".")
    for part in parents:
        doc = doc[int(part)] if part.isdigit() else doc[part]  # type: ignore[index]
    doc[name] = value


@pytest.mark.parametrize(
    "path",
    [
        *_declared(RecordSchema),
        *_declared(Turn, "turns[0]."),
        *_declared(Overlong, "overlong."),
    ],
)
def test_every_declared_record_field_is_checked(path: str) -> None:
    record = copy.deepcopy(ALIGNED)
    record["overlong"] = {"tokens": 9000, "limit": 8192}
    validate_record(record, WHERE)
    _put(record, path, NOT_JSON)
    assert _refused_field(lambda: validate_record(record, WHERE)) == path


@pytest.mark.parametrize(
    "path",
    [
        *_declared(Metrics),
        *_declared(RateBlock, "m1."),
        *_declared(RateBlock, "m2."),
        *_declared(ParseFailCounts, "parse_fail."),
        *_declared(Fingerprints, "fingerprints."),
    ],
)
def test_every_declared_metrics_field_is_checked(path: str) -> None:
    metrics = _demo_metrics()
    validate_metrics(metrics, "metrics.json")
    _put(metrics, path, NOT_JSON)
    assert _refused_field(lambda: validate_metrics(metrics, "metrics.json")) == path


@pytest.mark.parametrize("name", _declared(ShardScope))
def test_every_declared_shard_scope_field_is_checked(name: str) -> None:
    shard = {**SHARD, name: NOT_JSON}
    validate_shard_scope(dict(SHARD), "metrics.json")
    assert _refused_field(lambda: validate_shard_scope(shard, "metrics.json")) == (
        f"scope.shard.{name}"
    )


# -- valid input -------------------------------------------------------------------------


def test_a_real_demo_run_passes_the_validator_and_the_recount(tmp_path: Path) -> None:
    records = list(read_records(DEMO_RUN / "predictions.jsonl"))
    assert [r["id"] for r in records] == ["s0001", "s0003", "s0005", "s0017"]
    assert [r["aligned"] for r in records] == [True, False, False, False]
    metrics = validate_metrics(_demo_metrics(), "metrics.json")
    assert metrics["n"] == 4 and metrics["m1"]["correct"] == 2
    run = shutil.copytree(DEMO_RUN, tmp_path / "run")
    assert recount_run(run)["m2"]["total"] == metrics["m2"]["total"] == 14


def _scenario(sid: str, turns: list[str], chain: list[str] | None) -> Any:
    messages = [{"role": "system", "content": "objects : mug counter"}]
    for text in [*turns, "sink"]:
        messages += [{"role": "user", "content": "go"}, {"role": "assistant", "content": text}]
    obj: dict[str, Any] = {"id": sid, "messages": messages}
    if chain is not None:
        obj["memory_chain"] = chain
    return parse_record(obj, where="x", index=0)


@pytest.mark.parametrize(
    ("chain", "outputs", "granularity"),
    [
        (["pick mug", "place mug"], [("pick mug", True), ("place cup", True)], "memory_chain"),
        (None, [("pick mug", True), ("", True)], "message"),
        (["pick mug"], [("pick mug", True), ("place mug", None)], "unaligned"),
        (["pick mug", "place mug"], [("pick mug", False), ("place mug", True)], "memory_chain"),
    ],
    ids=["chain", "no-chain-with-parse-failure", "unaligned", "cut-off-turn"],
)
def test_every_record_score_builds_passes(
    chain: list[str] | None, outputs: list[tuple[str, bool | None]], granularity: str
) -> None:
    scenario = _scenario("s", ["pick mug", "place mug"], chain)
    rollout = Rollout(tuple(TurnOutput(t, s) for t, s in [*outputs, ("sink", True)]), "test")
    record = score(scenario, rollout, ParseRules(), worker="gw0", device="cpu", decode_s=0.5)
    assert validate_record(record, WHERE) is record
    assert {t["granularity"] for t in record["turns"]} == {granularity}


def test_one_schema_version() -> None:
    import pytest_memeval.core.scoring as scoring

    assert METRICS_SCHEMA_VERSION == SCHEMA_VERSION == _demo_metrics()["schema_version"] == 1
    assert not hasattr(scoring, "RECORD_VERSION")


# -- records: each refusal names the place, the scenario, the field and the problem ----------


def _set(path: str, value: Any) -> Callable[[Record], None]:
    """Set (or, with ``...``, delete) a field given as ``turns.1.match`` on a record."""

    def change(rec: Record) -> None:
        *parents, last = path.split(".")
        target: Any = rec
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        key_or_index: Any = int(last) if last.isdigit() else last
        if value is ...:
            del target[key_or_index]
        else:
            target[key_or_index] = value

    return change


BAD_RECORDS: dict[str, tuple[Record, Callable[[Record], None], str | None, str]] = {
    "missing-field": (
        ALIGNED,
        _set("final_match", ...),
        "final_match",
        "missing field 'final_match'",
    ),
    "wrong-type": (
        ALIGNED,
        _set("final_match", "yes"),
        "final_match",
        "field 'final_match' must be true or false, got \"yes\"",
    ),
    "bool-is-not-a-count": (
        ALIGNED,
        _set("n_turns", True),
        "n_turns",
        "field 'n_turns' must be an integer, got true",
    ),
    "turn-field-wrong-type": (
        ALIGNED,
        _set("turns.1.match", "x"),
        "turns[1].match",
        "field 'turns[1].match' must be true or false or null, got \"x\"",
    ),
    "turn-field-missing": (
        ALIGNED,
        _set("turns.2.target", ...),
        "turns[2].target",
        "missing field 'turns[2].target'",
    ),
    "turn-not-an-object": (
        ALIGNED,
        _set("turns.0", "pick mug"),
        "turns[0]",
        "field 'turns[0]' must be a JSON object, got \"pick mug\"",
    ),
    "match-without-ground-truth": (
        ALIGNED,
        _set("turns.0.gt", None),
        "turns[0].match",
        "field 'turns[0].match' is false but 'turns[0].gt' is null (a turn is scored exactly "
        "when it has a ground truth)",
    ),
    "unaligned-turn-scored": (
        UNALIGNED,
        _set("turns.4.match", True),
        "turns[4].match",
        "field 'turns[4].match' is true but 'turns[4].gt' is null",
    ),
    "parse-failure-matches": (
        ALIGNED,
        _set("parse_fail", True),
        "final_match",
        "field 'final_match' is true but 'parse_fail' is true (a parse failure never matches)",
    ),
    "reason-without-parse-failure": (
        ALIGNED,
        _set("parse_fail_reason", "empty output"),
        "parse_fail_reason",
        "field 'parse_fail_reason' is given but 'parse_fail' is false",
    ),
    "turn-count": (
        ALIGNED,
        _set("n_turns", 13),
        "n_turns",
        "field 'n_turns' is 13, but 'turns' has 14 entries",
    ),
    "turn-index": (
        ALIGNED,
        _set("turns.3.index", 4),
        "turns[3].index",
        "field 'turns[3].index' is 4, expected 3",
    ),
    "aligned-disagrees-with-chain": (
        UNALIGNED,
        _set("n_memory_chain", 6),
        "aligned",
        "field 'aligned' is false, but 'n_memory_chain' is 6 and 'n_turns' 6",
    ),
    "granularity-disagrees": (
        ALIGNED,
        _set("turns.0.granularity", "unaligned"),
        "turns[0].granularity",
        "field 'turns[0].granularity' is \"unaligned\", but 'aligned' is true",
    ),
    "unknown-granularity": (
        ALIGNED,
        _set("turns.0.granularity", "words"),
        "turns[0].granularity",
        "field 'turns[0].granularity' must be one of memory_chain, message, unaligned",
    ),
    "optional-field-wrong-type": (
        ALIGNED,
        _set("decode_s", "fast"),
        "decode_s",
        "field 'decode_s' must be a number, got \"fast\"",
    ),
    "notes-not-strings": (ALIGNED, _set("notes", ["ok", 3]), "notes[1]", "field 'notes[1]'"),
    "overlong-incomplete": (
        ALIGNED,
        _set("overlong", {"tokens": 900}),
        "overlong.limit",
        "missing field 'overlong.limit'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS), ids=list(BAD_RECORDS))
def test_a_bad_record_is_refused_naming_line_scenario_and_field(case: str) -> None:
    base, change, field, problem = BAD_RECORDS[case]
    record = copy.deepcopy(base)
    validate_record(record, WHERE)  # the unchanged record passes
    change(record)
    with pytest.raises(RecordError) as info:
        validate_record(record, WHERE)
    error = info.value
    assert str(error).startswith(f"{WHERE}: scenario {base['id']!r}: {problem}"), str(error)
    assert (error.field, error.scenario) == (field, base["id"])
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([1, 2], f"{WHERE}: not a JSON object, got [1, 2]"),
        ({"final_pred": "x"}, f"{WHERE}: missing field 'id'"),
        ({**ALIGNED, "id": 7}, f"{WHERE}: field 'id' must be a string, got 7"),
    ],
    ids=["not-an-object", "no-id", "id-not-a-string"],
)
def test_a_record_without_a_readable_id_names_the_line(obj: object, message: str) -> None:
    with pytest.raises(RecordError) as info:
        validate_record(obj, WHERE)
    assert str(info.value) == message
    assert info.value.scenario is None


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


def test_read_records_names_the_line(tmp_path: Path) -> None:
    good = [json.dumps(r) for r in _demo_records()]
    header = json.dumps({"memeval_journal": 1, "ckpt": "oracle"})
    path = _write(tmp_path / "journal.jsonl", [header, good[0], "", good[1]])
    assert [r["id"] for r in read_records(path)] == ["s0001", "s0003"]

    _write(path, [good[0], '{"id": "s0003", '])
    with pytest.raises(RecordError, match=rf"^{path}:2: malformed JSON \("):
        list(read_records(path))

    _write(path, [good[0], good[1], good[0]])
    with pytest.raises(RecordError) as info:
        list(read_records(path))
    assert str(info.value) == (
        f"{path}:3: scenario 's0001': field 'id': the scenario appears twice (first on line 1)"
    )

    broken = copy.deepcopy(UNALIGNED)
    del broken["turns"][5]["pred"]
    _write(path, [good[0], json.dumps(broken)])
    with pytest.raises(RecordError) as info:
        list(read_records(path))
    assert str(info.value) == f"{path}:2: scenario 's0003': missing field 'turns[5].pred'"


# -- metrics --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"schema_version": 2}, "schema_version", "field 'schema_version' is 2; this version"),
        ({"ckpt": None}, "ckpt", "field 'ckpt' must be a string, got null"),
        ({"m1": {"correct": 2, "total": 4}}, "m1.rate", "missing field 'm1.rate'"),
        ({"m2": [5, 14]}, "m2", "field 'm2' must be a JSON object, got [5, 14]"),
        ({"parse_fail": {"final": 0}}, "parse_fail.turns", "missing field 'parse_fail.turns'"),
        ({"not_selected": ["s0002", 4]}, "not_selected[1]", "field 'not_selected[1]' must be"),
        ({"stop_flags": "some"}, "stop_flags", "field 'stop_flags' must be one of present, "),
        ({"n": 5}, "m1.total", "field 'm1.total' is 4, but 'n' is 5"),
        ({"timing": 3.5}, "timing", "field 'timing' must be a JSON object, got 3.5"),
        (
            {"fingerprints": {"model": 3}},
            "fingerprints.model",
            "field 'fingerprints.model' must be a string or null, got 3",
        ),
    ],
)
def test_bad_metrics_are_refused_naming_the_field(
    change: dict[str, Any], field: str, problem: str
) -> None:
    metrics = {**_demo_metrics(), **change}
    with pytest.raises(RecordError) as info:
        validate_metrics(metrics, "run/metrics.json")
    assert str(info.value).startswith(f"run/metrics.json: {problem}"), str(info.value)
    assert info.value.field == field


def test_metrics_fields_required_and_counts_only() -> None:
    metrics = _demo_metrics()
    del metrics["ckpt"]
    with pytest.raises(RecordError, match=r"^m\.json: missing field 'ckpt'$"):
        validate_metrics(metrics, "m.json")
    # The recount's reading needs the counts only (older and hand-made count files).
    counts = dict(Tally().extend(_demo_records()).counts())
    assert validate_metrics(counts, "m.json", counts_only=True)["n"] == 4
    del counts["unaligned"]
    with pytest.raises(RecordError, match="missing field 'unaligned'"):
        validate_metrics(counts, "m.json", counts_only=True)
    # Fields that came later are optional: older metrics lack them.
    older = {k: v for k, v in _demo_metrics().items() if k not in ("stop_flags", "overlong")}
    validate_metrics(older, "m.json")
    with pytest.raises(RecordError, match=r"^m\.json: not a JSON object .*got \[\]"):
        validate_metrics([], "m.json")


# -- replay input ---------------------------------------------------------------------------


def test_prediction_lines_are_normalised_and_refused_naming_the_field() -> None:
    line = {"id": "s1", "final_pred": "sink", "turns": [{"pred": "a"}], "final_gt": "x"}
    assert validate_prediction(line, WHERE) == {
        "id": "s1",
        "final_pred": "sink",
        "final_stopped": None,
        "turns": [{"pred": "a", "stopped": None}],
        "prompt_tail": "",
    }
    flagged = {**line, "final_stopped": True, "turns": [{"pred": "a", "stopped": False}]}
    assert (
        validate_prediction({**flagged, "prompt_tail": "<q>"}, WHERE)["turns"][0]["stopped"]
        is False
    )
    assert validate_prediction({**line, "prompt_tail": 3}, WHERE)["prompt_tail"] == ""
    for bad, field, problem in [
        (
            {**line, "final_stopped": True},
            "turns[0].stopped",
            "field 'turns[0].stopped' is missing",
        ),
        (
            {**line, "final_stopped": "yes"},
            "final_stopped",
            "field 'final_stopped' must be true, false or absent, got \"yes\"",
        ),
        ({**line, "turns": [{"text": "a"}]}, "turns[0].pred", "missing field 'turns[0].pred'"),
        ({**line, "turns": "a"}, "turns", "field 'turns' must be a list, got str"),
    ]:
        with pytest.raises(RecordError) as info:
            validate_prediction(bad, WHERE)
        assert str(info.value).startswith(f"{WHERE}: scenario 's1': {problem}"), str(info.value)
        assert (info.value.field, info.value.scenario) == (field, "s1")
    with pytest.raises(RecordError, match=r"not a JSON object \(a prediction line is"):
        validate_prediction("s1", WHERE)


# -- the readers: recount, expect --------------------------------------------------------------


def _bad_run(tmp_path: Path) -> Path:
    run = shutil.copytree(DEMO_RUN, tmp_path / "run")
    lines = (run / "predictions.jsonl").read_text("utf-8").splitlines()
    rec = json.loads(lines[2])
    rec["turns"][0]["match"] = True  # s0005 is unaligned: gt null
    lines[2] = json.dumps(rec)
    _write(run / "predictions.jsonl", lines)
    return run


def test_recount_and_known_failures_refuse_a_bad_record_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _bad_run(tmp_path)
    where = f"{run / 'predictions.jsonl'}:3: scenario 's0005': field 'turns[0].match' is true"
    with pytest.raises(RecountError) as info:
        recount_run(run)
    assert str(info.value).startswith(where)
    assert main(["recount", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"memeval recount: FAIL: {where}" in err and "Traceback" not in err
    with pytest.raises(ExpectError) as expect:
        load_known_failures(run / "predictions.jsonl")
    assert where in str(expect.value)
    with pytest.raises(ExpectError, match="fails the recount"):
        load_known_failures(run)


def test_recount_refuses_metrics_that_are_not_a_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(DEMO_RUN, tmp_path / "run")
    (run / "metrics.json").write_text("[1, 2]", "utf-8")
    assert main(["recount", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"FAIL: {run / 'metrics.json'}: not a JSON object" in err and "Traceback" not in err
    (run / "metrics.json").write_bytes(b"\xff\xfe{}")
    assert main(["recount", str(run)]) == 1
    assert "not UTF-8 text" in capsys.readouterr().err
