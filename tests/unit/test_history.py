"""Free-running (``--memeval-history model``) against teacher-forced, through public seams:
the facts a record carries, their recount, the metrics block, run directory names and
fingerprints, and the refusals to mix the two histories (recount, replay, known failures,
compare) with the one comparison that pairs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import from_records, parse_record
from pytest_memeval.core.free_running import position_rows, teacher_forced_beside
from pytest_memeval.core.history import (
    describe_history,
    fed_back,
    history_of,
    other_differences,
    teacher_forced_sibling_name,
)
from pytest_memeval.core.matching import ParseRules
from pytest_memeval.core.metrics import Tally
from pytest_memeval.core.records import (
    RecordError,
    Rollout,
    TurnOutput,
    validate_metrics,
    validate_record,
)
from pytest_memeval.core.recount import RecountError, recount_file, recount_run
from pytest_memeval.core.results import load_checked_run
from pytest_memeval.core.scoring import departure, score
from pytest_memeval.decode.replay import ReplayError, check_replay_history, load_replay_source
from pytest_memeval.runtime.session import decoding_fingerprint, decoding_settings, run_dir_name
from pytest_memeval.tools.compare import (
    CompareError,
    compare_many,
    compare_runs,
    format_history_pair,
    history_pair,
    load_run,
)
from pytest_memeval.tools.gate import ExpectError, load_known_failures

from ..runfactory import conv, make_record, with_history, write_jsonl, write_run

RAW = {
    "messages": conv("pick mug", "place mug", "pick cup", final="sink"),
    "memory_chain": ["pick mug", "place mug", "pick cup"],
}
SCENARIO = parse_record({"id": "s1", **RAW}, where="x", index=0)


def rollout(*texts: str, history: str = "model") -> Rollout:
    return Rollout(tuple(TurnOutput(t, True) for t in texts), "test", history=history)


# -- the record's facts ----------------------------------------------------------------------


def test_left_truth_at_is_the_first_turn_whose_fed_back_text_is_not_the_truth() -> None:
    rec = score(SCENARIO, rollout("pick mug", "place cup", "pick cup", "sink"), ParseRules())
    assert rec["history"] == "model"
    # Turn 1 left the truth; of the one turn after it, one was right.
    assert (rec["left_truth_at"], rec["still_right_after"]) == (1, 1)
    # Surrounding whitespace is what a chat client strips: it does not leave the truth.
    assert fed_back("  pick mug \n") == "pick mug"
    padded = score(SCENARIO, rollout(" pick mug ", "place mug", "pick cup", "x"), ParseRules())
    assert (padded["left_truth_at"], padded["still_right_after"]) == (None, None)
    # Inside the text every byte counts (matching would call "Pick mug" right: it is not the
    # truth the next prompt would hold).
    cased = score(SCENARIO, rollout("Pick mug", "place mug", "pick cup", "x"), ParseRules())
    assert cased["turns"][0]["match"] is True
    assert (cased["left_truth_at"], cased["still_right_after"]) == (0, 2)
    truth = score(SCENARIO, rollout("pick mug", "x", "y", "sink", history="truth"), ParseRules())
    assert truth["history"] == "truth" and truth["left_truth_at"] == 1


def test_unaligned_scenarios_have_a_departure_but_no_count_after_it() -> None:
    unaligned = parse_record(
        {"id": "u", "messages": conv("open fridge", "pick mug"), "memory_chain": ["pick mug"]},
        where="x",
        index=0,
    )
    rec = score(unaligned, rollout("open fridge", "pick cup", "fridge"), ParseRules())
    assert (rec["left_truth_at"], rec["still_right_after"]) == (1, None)
    assert departure(rec["turns"], aligned=False) == (1, None)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"history": "greedy"}, "history", "must be one of truth, model"),
        ({"left_truth_at": 3}, "left_truth_at", "has 3 turn(s)"),
        ({"still_right_after": None}, "still_right_after", "is null, but 'left_truth_at' is 1"),
        ({"still_right_after": 2}, "still_right_after", "only 1 turn(s) follow"),
        ({"left_truth_at": None}, "still_right_after", "is given, but 'left_truth_at' is null"),
    ],
)
def test_the_validator_checks_the_facts_shape(
    change: dict[str, Any], field: str, words: str
) -> None:
    rec = score(SCENARIO, rollout("pick mug", "place cup", "pick cup", "sink"), ParseRules())
    validate_record(rec, "p.jsonl:1")
    with pytest.raises(RecordError) as info:
        validate_record({**rec, **change}, "p.jsonl:1")
    assert info.value.field == field and words in str(info.value)
    lone = {k: v for k, v in rec.items() if k != "still_right_after"}
    with pytest.raises(RecordError, match="missing field 'still_right_after'"):
        validate_record(lone, "p.jsonl:1")


# -- metrics and the recount -----------------------------------------------------------------


def _records(history: str) -> list[dict[str, Any]]:
    outs = [
        ("pick mug", "place mug", "pick cup", "sink"),  # never left the truth
        ("pick cup", "place cup", "pick cup", "sink"),  # left at 0, one right after it
        ("pick mug", "place cup", "pick mug", "x"),  # left at 1, none right after it
    ]
    bench = from_records([{"id": f"s{i}", **RAW} for i in range(3)], "b")
    return [
        dict(score(s, rollout(*o, history=history), ParseRules()))
        for s, o in zip(bench.scenarios, outs, strict=True)
    ]


def test_metrics_count_where_the_scenarios_left_the_truth(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", _records("model"), ckpt="c", history="model")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["history"] == "model"
    assert metrics["left_truth"] == {
        "at": {"0": 1, "1": 1},
        "never": 1,
        "still_right": {"correct": 1, "total": 3},
    }
    validate_metrics(metrics, "m")
    assert recount_run(run)["left_truth"] == metrics["left_truth"]


def test_the_recount_rederives_the_facts_from_the_turns(tmp_path: Path) -> None:
    records = _records("model")
    records[1]["left_truth_at"], records[1]["still_right_after"] = 1, 0  # doctored
    run = write_run(tmp_path / "r", records, ckpt="c", history="model")
    with pytest.raises(RecountError, match=r"scenario 's1': the record says left_truth_at 1"):
        recount_run(run)
    with pytest.raises(RecountError, match="its turns give 0, 1"):
        recount_file(run / "predictions.jsonl")


def test_the_recount_refuses_a_run_that_mixes_histories(tmp_path: Path) -> None:
    mixed = _records("model")[:2] + _records("truth")[2:]
    run = write_run(tmp_path / "mixed", mixed, ckpt="c", history="model")
    with pytest.raises(RecountError, match=r"mix teacher-forced \(truth\) and free-running"):
        recount_run(run)
    # Metrics that claim the other history than every record has.
    run = write_run(tmp_path / "claimed", _records("model"), ckpt="c", history="truth")
    with pytest.raises(RecountError, match="history: metrics say 'truth', the records say 'model'"):
        recount_run(run)
    # A run written before histories existed: records and metrics say nothing (truth).
    old = [{k: v for k, v in r.items() if k not in ("history",)} for r in _records("truth")]
    recount_run(write_run(tmp_path / "old", old, ckpt="c"))


# -- run directory, fingerprints, words ------------------------------------------------------


def test_a_free_running_run_has_its_own_directory_and_decoding_fingerprint() -> None:
    from pytest_memeval.core.profiles import BenchmarkSpec, Profile

    assert run_dir_name("oracle", {}) == "oracle"
    assert run_dir_name("oracle", {}, "model") == "oracle@history-model"
    over = {"generation.dtype": {"value": "bfloat16", "profile": "float32"}}
    assert run_dir_name("oracle", over, "model") == "oracle@dtype-bfloat16@history-model"
    assert teacher_forced_sibling_name("oracle@dtype-bfloat16@history-model") == (
        "oracle@dtype-bfloat16"
    )
    assert teacher_forced_sibling_name("oracle") is None
    profile = Profile("p", "model", BenchmarkSpec(path=Path("b")), Path("pyproject.toml"))
    # A teacher-forced run keeps the fingerprint every earlier run has.
    assert decoding_settings(profile, "truth") == profile.generation.as_dict()
    truth = decoding_fingerprint(decoding_settings(profile, "truth"))
    model = decoding_fingerprint(decoding_settings(profile, "model"))
    assert truth == decoding_fingerprint(profile.generation.as_dict()) != model
    assert describe_history("model").startswith("model (free-running")
    assert history_of({}) == "truth"


def test_other_differences_ignore_the_history_and_the_decode_path() -> None:
    a = {
        "kind": "model",
        "fingerprints": {"benchmark": "b", "model": "m", "adapter": "x", "decoding": "d1"},
        "decoding": {"max_new_tokens": 16, "dtype": "float32", "path": "fast"},
    }
    b = {
        **a,
        "fingerprints": {**a["fingerprints"], "decoding": "d2"},  # type: ignore[dict-item]
        "decoding": {"max_new_tokens": 16, "dtype": "float32", "path": "reference"},
        "history": "model",
    }
    assert other_differences(a, b) == []
    c = {**b, "decoding": {"max_new_tokens": 8, "dtype": "float32"}}
    assert other_differences(a, c) == ["decoding max_new_tokens (A 16, B 8)"]


# -- replay and known failures ---------------------------------------------------------------


def test_replay_refuses_predictions_of_the_other_history(tmp_path: Path) -> None:
    bench = from_records([{"id": "s1", **RAW}, {"id": "s2", **RAW}], "b")
    lines = [
        {"id": sid, "final_pred": "sink", "turns": [{"pred": "pick mug"}] * 3, "history": h}
        for sid, h in (("s1", "model"), ("s2", "model"))
    ]
    source = load_replay_source(write_jsonl(tmp_path / "p.jsonl", lines), bench, ["s1", "s2"])
    assert source.history == "model" and "its lines say so" in source.history_from
    check_replay_history(source, "model")
    with pytest.raises(ReplayError, match=r"made free-running \(history model.*--memeval-history"):
        check_replay_history(source, "truth")
    # Beside a run's metrics.json, the metrics say it (a run older than histories: truth).
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({**Tally().counts(), "n": 0}), "utf-8")
    plain = [{k: v for k, v in line.items() if k != "history"} for line in lines]
    source = load_replay_source(write_jsonl(run / "p.jsonl", plain), bench, ["s1"])
    assert source.history == "truth" and "metrics.json says so" in source.history_from
    # Lines that mix the two are refused, naming both lines.
    lines[1]["history"] = "truth"
    with pytest.raises(ReplayError, match=r"p2.jsonl:2: .*line 1 with history model"):
        load_replay_source(write_jsonl(tmp_path / "p2.jsonl", lines), bench, ["s1", "s2"])
    # Another harness's file says nothing: the run takes the user's word.
    source = load_replay_source(write_jsonl(tmp_path / "p3.jsonl", plain), bench, ["s1"])
    assert source.history is None
    check_replay_history(source, "truth")
    check_replay_history(source, "model")


def test_known_failures_of_the_other_history_are_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", _records("model"), ckpt="c", history="model")
    assert load_known_failures(run, "model")
    with pytest.raises(ExpectError, match=r"evaluated free-running \(history model\)"):
        load_known_failures(run, "truth")
    assert load_known_failures(run / "predictions.jsonl") == load_known_failures(run, "model")


# -- compare: refused, or paired ------------------------------------------------------------

FPS = {"benchmark": "sha256:b", "model": "sha256:m", "adapter": "sha256:a", "decoding": "d"}


def _pair(tmp_path: Path, *, adapter: str = "sha256:a") -> tuple[Path, Path]:
    """A teacher-forced run and a free-running run of 6 scenarios: s1 and s2 derail (right
    teacher-forced, wrong free-running), s3 recovers; s1..s3 leave the truth at turn 0 in
    both runs (the same prompt, the same wrong turn) and lose their second turn only
    free-running, where the wrong turn stays in the history."""
    truth, model = [], []
    for i in range(6):
        sid = f"s{i}"
        left = i in (1, 2, 3)
        truth.append(
            with_history(
                make_record(
                    sid,
                    i,
                    final_match=i != 3,
                    turn_matches=[not left, True],
                    turn_preds=["pick cup from counter", "place mug in sink"] if left else None,
                ),
                "truth",
            )
        )
        model.append(
            with_history(
                make_record(
                    sid,
                    i,
                    final_match=i not in (1, 2),
                    turn_matches=[not left, not left],
                    turn_preds=["pick cup from counter", "look around"] if left else None,
                ),
                "model",
            )
        )
    a = write_run(tmp_path / "c", truth, ckpt="c", history="truth", fingerprints=FPS)
    fps_b = {**FPS, "adapter": adapter, "decoding": "d-model"}
    b = write_run(
        tmp_path / "c@history-model", model, ckpt="c", history="model", fingerprints=fps_b
    )
    return a, b


def test_compare_pairs_the_two_histories_of_one_checkpoint(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    run_a, run_b = load_run(a), load_run(b)
    result = compare_runs(run_a, run_b)
    assert (result["a"]["label"], result["b"]["label"]) == (
        "c (teacher-forced)",
        "c (free-running)",
    )
    pair = history_pair(run_a, run_b, result)
    assert pair is not None
    assert pair["derailed"] == ["s1", "s2"] and pair["recovered"] == ["s3"]
    assert pair["m1_gap_pp"] == pytest.approx(-100 / 6)
    assert pair["lost_turns"] == ["s1", "s2", "s3"] and pair["gained_turns"] == []
    assert pair["m2_gap_pp"] == pytest.approx(-25.0)
    assert pair["m1_p"] == result["mcnemar"]["p_value"]
    assert pair["differs_before_departure"] == []
    left = pair["left_truth"]["free_running"]
    assert left is not None and left["at"] == {"0": 3} and left["never"] == 3
    text = "\n".join(format_history_pair(pair, result["n"]))
    assert "derailed (m1 right teacher-forced, wrong free-running): 2: 's1', 's2'" in text
    assert "gap -16.67 pp" in text
    # The other order: the same gap (free-running minus teacher-forced), the same lists.
    back = compare_runs(run_b, run_a)
    reverse = history_pair(run_b, run_a, back)
    assert reverse is not None
    assert reverse["m1_gap_pp"] == pytest.approx(pair["m1_gap_pp"])
    assert reverse["m1_gap_ci95_pp"] == pytest.approx(pair["m1_gap_ci95_pp"])
    assert reverse["m2_gap_ci95_pp"] == pytest.approx(pair["m2_gap_ci95_pp"])
    assert (reverse["derailed"], reverse["recovered"]) == (["s1", "s2"], ["s3"])
    # Two runs of one history are no such pair.
    assert history_pair(run_a, run_a, compare_runs(run_a, run_a)) is None


def test_outputs_before_the_first_departure_must_be_alike(tmp_path: Path) -> None:
    """Up to the first departure the prompts were the teacher-forced ones: a scenario whose
    outputs differ there (s0 never left the truth but answers the final query otherwise; s1
    left at turn 0 with another wrong turn than the teacher-forced run's) is named."""
    a, b = _pair(tmp_path)
    records = [json.loads(line) for line in (b / "predictions.jsonl").read_text().splitlines()]
    records[0]["final_pred"] = "a different answer"
    records[0]["final_match"] = False
    records[1]["turns"][0]["pred"] = "pick plate from counter"
    write_run(b, records, ckpt="c", history="model", fingerprints={**FPS, "decoding": "d-m"})
    truth = [json.loads(line) for line in (a / "predictions.jsonl").read_text().splitlines()]
    truth[2]["turns"][1]["pred"] = "place mug in the sink"  # after s2's departure: allowed
    truth[2] = with_history(truth[2], "truth")
    write_run(a, truth, ckpt="c", history="truth", fingerprints=FPS)
    run_a, run_b = load_run(a), load_run(b)
    pair = history_pair(run_a, run_b, compare_runs(run_a, run_b))
    assert pair is not None and pair["differs_before_departure"] == ["s0", "s1"]
    assert "WARNING: 2 scenario(s) answer differently in the two runs where" in "\n".join(
        format_history_pair(pair, 6)
    )


def test_compare_refuses_two_histories_of_two_checkpoints(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, adapter="sha256:other")
    with pytest.raises(CompareError, match=r"differ in more than that: adapter fingerprint"):
        compare_runs(load_run(a), load_run(b))
    a2, b2 = _pair(tmp_path / "same")
    with pytest.raises(CompareError, match="the runs mix teacher-forced and free-running"):
        compare_many(load_run(a2), [load_run(a2), load_run(b2)])


def test_the_teacher_forced_run_beside_a_free_running_one(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    free = load_checked_run(b).metrics
    beside = teacher_forced_beside(b, free)
    assert beside.path == a and beside.metrics is not None
    rows = position_rows(free, beside.metrics)
    assert [r.label for r in rows] == ["0", "1", "never"]
    assert rows[0].free_running == rows[0].teacher_forced == {"correct": 3, "total": 6}
    assert (rows[1].free_running, rows[1].teacher_forced) == (
        {"correct": 3, "total": 6},
        {"correct": 6, "total": 6},
    )
    assert [r.left_truth for r in rows] == [3, 0, 3]
    # Another adapter beside it: not shown, and the note says why.
    _, other_b = _pair(tmp_path / "other", adapter="sha256:other")
    note = teacher_forced_beside(other_b, load_checked_run(other_b).metrics).note
    assert "is not shown beside it: it evaluates something else: adapter fingerprint" in note
    assert "not a '<ckpt>@history-model' directory" in teacher_forced_beside(a, free).note
    missing = tmp_path / "gone@history-model"
    assert "no finished teacher-forced run in" in teacher_forced_beside(missing, free).note


def test_positions_are_grouped_to_fit_the_terminal() -> None:
    free = {
        "m2_by_position": {str(p): {"correct": 1, "total": 2} for p in range(40)},
        "left_truth": {
            "at": {"0": 5, "39": 1},
            "never": 2,
            "still_right": {"correct": 0, "total": 0},
        },
    }
    rows = position_rows(free, None)  # type: ignore[arg-type]
    assert len(rows) == 11 and rows[0].label == "0-3" and rows[-2].label == "36-39"
    assert rows[0].free_running == {"correct": 4, "total": 8} and rows[0].teacher_forced is None
    assert [r.left_truth for r in rows] == [5, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]


def test_pages_show_a_free_running_run_beside_its_teacher_forced_run(tmp_path: Path) -> None:
    """pytest-html's summary and ``memeval report`` of a free-running run alone: where it left
    the truth, the teacher-forced run found beside it, both m2 curves, the departures chart;
    of the two histories together, the gap with the derailed scenarios linked."""
    from pytest_memeval.tools.report import render_report, summary_html

    a, b = _pair(tmp_path)
    free = load_checked_run(b).metrics
    html = summary_html(free, None, b)
    assert "history: model (free-running" in html
    assert f"teacher-forced run of this checkpoint: {a}" in html
    assert "<th style=" in html and ">never</td>" in html
    assert "history:" not in summary_html(load_checked_run(a).metrics, None, a)
    page = render_report([load_run(b)])
    assert page.count("<polyline") == 2 and 'data-run="c (teacher-forced)"' in page
    assert 'class="departure-chart"' in page and "Teacher-forced and free-running" in page
    both = render_report([load_run(a), load_run(b)])
    assert "derailed: 2 (right teacher-forced, wrong free-running)" in both
    assert "href='#s-s1'" in both and 'class="departure-chart"' in both
    # A teacher-forced run alone has no such section.
    assert "Teacher-forced and free-running" not in render_report([load_run(a)])
