"""The replay decoder: score stored predictions without a model.

Two sources, one format: an earlier run's ``predictions.jsonl`` (after merging shards, or
after a change of the matching rule), and the predictions of another harness (the seed's
``--mode score_only`` flow: JSONL lines with ``id``, ``final_pred``, ``turns[].pred``,
sometimes ``final_gt``, and no stop flags). Either way the stored raw outputs are scored
again against the (current) benchmark.

The whole file is checked against the benchmark once, at configure time
(:func:`load_replay_source`), so a bad file is one usage error naming file, line, scenario
and field, never one error per item. Each line's format is checked by
:func:`pytest_memeval.core.records.validate_prediction`; the fit to the benchmark here.
What a line needs:

* ``id``: a scenario of the benchmark, once in the file;
* ``final_pred``: a string;
* ``turns``: a list of ``{"pred": str}``, one per assistant turn before the final answer;
* stop flags (``final_stopped`` and each turn's ``stopped``, booleans): on every output of
  the line or on none of them, and on every line of the file or on none. A file without
  them is accepted: the harness that wrote it already decided where each output ended, so
  its outputs are taken as ended (and a cut-off output cannot be told apart). A file that
  mixes lines with and without them is refused: it is almost always two harnesses' files
  concatenated, and one run must say one thing about cut-off detection.

Other fields (``final_gt``, ``index``, ``final_match``...) are ignored: scoring uses the
benchmark's ground truth. ``prompt_tail`` is kept when it is a string.

Predictions were made with one history: teacher-forced or free-running (``history`` of the
lines our runs write, and of the ``metrics.json`` beside them). A replay says which with
``--memeval-history``, and is refused when the file says otherwise (or mixes both): re-scored
free-running predictions are a free-running run (``runs/<ckpt>@history-model``), never a
teacher-forced one. Another harness's file says nothing: the run takes the user's word.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_memeval.core.benchmark import Benchmark, BenchmarkError, Scenario
from pytest_memeval.core.formatting import shown_ids, shown_list
from pytest_memeval.core.history import HISTORIES, HISTORY_TRUTH, history_of, history_words
from pytest_memeval.core.profiles import Profile
from pytest_memeval.core.records import (
    Metrics,
    Prediction,
    RecordError,
    Rollout,
    TurnOutput,
    validate_metrics,
    validate_prediction,
)
from pytest_memeval.core.rundir import JOURNAL_HEADER_KEY, METRICS

__all__ = [
    "STOP_FLAGS_ABSENT",
    "STOP_FLAGS_PRESENT",
    "ReplayDecoder",
    "ReplayError",
    "ReplayPrediction",
    "ReplaySource",
    "check_replay_history",
    "load_replay_source",
    "source_fingerprints",
]

#: ``stop_flags`` of metrics.json: every replayed output carried its stop flag (model runs too).
STOP_FLAGS_PRESENT = "present"
#: ``stop_flags`` of metrics.json: the predictions had no stop flags (another harness's file).
STOP_FLAGS_ABSENT = "absent"


class ReplayError(BenchmarkError):
    """The predictions file cannot be replayed against the benchmark; names file and line."""


@dataclass(frozen=True)
class ReplayPrediction:
    """One scenario's stored outputs: the turns' and the final answer's text, in order.

    ``stopped`` holds one flag per output (turns, then final), or is ``None`` when the file
    has no stop flags.
    """

    texts: tuple[str, ...]
    stopped: tuple[bool, ...] | None
    prompt_tail: str
    line: int


@dataclass(frozen=True)
class ReplaySource:
    """A predictions file checked against a benchmark: one prediction per scenario in scope.

    ``history``: the history the predictions were made with, where the file or the
    ``metrics.json`` beside it says (``None``: another harness's file, which does not);
    ``history_from`` what said it."""

    path: Path
    predictions: Mapping[str, ReplayPrediction]
    stop_flags: str  # STOP_FLAGS_PRESENT or STOP_FLAGS_ABSENT
    history: str | None = None
    history_from: str = ""


def check_replay_history(source: ReplaySource, history: str) -> None:
    """Refuse to replay predictions of one history as a run of the other
    (:class:`ReplayError`, naming the file and both histories)."""
    if source.history is None or source.history == history:
        return
    raise ReplayError(
        f"cannot replay {source.path}: its predictions were made {history_words(source.history)} "
        f"(history {source.history}: {source.history_from}), and this run is "
        f"{history_words(history)} (--memeval-history {history}); re-scoring them under the "
        f"other history would mix the two. Replay them with --memeval-history {source.history}."
    )


def _metrics_beside(predictions: Path) -> Metrics | None:
    """The checked ``metrics.json`` beside a predictions file (``None`` when there is none:
    another harness's file)."""
    metrics_path = predictions.parent / METRICS
    if not metrics_path.is_file():
        return None
    try:
        text = metrics_path.read_text(encoding="utf-8")
        # counts_only: only the fingerprints and the history are read here (typed).
        return validate_metrics(json.loads(text), str(metrics_path), counts_only=True)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchmarkError(
            f"{metrics_path}: unreadable metrics of the replayed run ({exc})"
        ) from None
    except RecordError as exc:  # names the file and the field
        raise BenchmarkError(f"metrics of the replayed run: {exc}") from None


def source_fingerprints(profile: Profile) -> dict[str, str | None]:
    """Model, adapter and decoding fingerprints of the run being replayed (if it has metrics).

    Another harness's file has no ``metrics.json`` beside it: its fingerprints are null.
    """
    assert profile.predictions is not None
    metrics = _metrics_beside(profile.predictions)
    if metrics is None:
        return dict.fromkeys(("model", "adapter", "decoding"))
    fps = metrics.get("fingerprints", {})
    return {
        "model": fps.get("model"),
        "adapter": fps.get("adapter"),
        "decoding": fps.get("decoding"),
    }


def _turn_count_problem(prediction: Prediction, scenario: Scenario) -> str | None:
    """What is wrong with the number of turn predictions for ``scenario``, if anything."""
    given, expected = len(prediction["turns"]), len(scenario.turn_indices)
    if given == expected:
        return None
    hint = (
        " (does 'turns' include the final answer? it goes in 'final_pred')"
        if given == expected + 1
        else ""
    )
    return (
        f"field 'turns' has {given} turn prediction(s), but the scenario has "
        f"{expected} assistant turn(s) before the final answer{hint}"
    )


@dataclass
class _LineReader:
    """The lines of one predictions file as they are read: the predictions that fit the
    benchmark, and what is wrong with the others (each problem naming file, line, scenario
    and field), in the file's order."""

    path: Path
    benchmark: Benchmark
    by_id: Mapping[str, Scenario]
    problems: list[str] = field(default_factory=list)
    predictions: dict[str, ReplayPrediction] = field(default_factory=dict)
    first_line: dict[str, int] = field(default_factory=dict)
    #: (line, id) of the first line with stop flags and of the first without
    with_flags: tuple[int, str] | None = None
    without_flags: tuple[int, str] | None = None
    #: lines without a readable id
    unidentified: int = 0
    #: the lines' own ``history`` (our runs write it), with the first line saying each
    histories: dict[str, int] = field(default_factory=dict)

    def read(self, lineno: int, line: str) -> None:
        """Check one line: its format (records.validate_prediction), then whether it fits
        the benchmark: an unknown or repeated id is named before a field of the line."""
        if not line.strip():
            return
        where = f"{self.path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            self.problems.append(f"{where}: malformed JSON ({exc.msg}, column {exc.colno})")
            self.unidentified += 1
            return
        if isinstance(obj, dict) and JOURNAL_HEADER_KEY in obj:
            return  # a journal's header line: replaying a journal is allowed
        prediction: Prediction | None = None
        try:
            prediction = validate_prediction(obj, where)
        except RecordError as exc:
            if exc.scenario is None:  # no readable id
                self.problems.append(str(exc))
                self.unidentified += 1
                return
            sid, line_problem = exc.scenario, exc.problem
        else:
            sid, line_problem = prediction["id"], ""
        where = f"{where}: scenario {sid!r}"
        scenario = self.by_id.get(sid)
        if scenario is None:
            self.problems.append(
                f"{where}: field 'id': no such scenario in {self.benchmark.source}"
            )
            return
        if sid in self.first_line:
            self.problems.append(
                f"{where}: field 'id': the scenario appears twice (first on line "
                f"{self.first_line[sid]})"
            )
            return
        self.first_line[sid] = lineno
        if prediction is None:
            self.problems.append(f"{where}: {line_problem}")
            return
        line_history = obj.get("history") if isinstance(obj, dict) else None
        self._take(where, lineno, prediction, scenario, line_history)

    def _take(
        self,
        where: str,
        lineno: int,
        prediction: Prediction,
        scenario: Scenario,
        line_history: object,
    ) -> None:
        """Keep a well-formed line of a scenario of the benchmark, unless its history or its
        number of turns is wrong."""
        if line_history is not None:
            if line_history not in HISTORIES:
                self.problems.append(
                    f"{where}: field 'history' must be one of {', '.join(HISTORIES)}, got "
                    f"{line_history!r}"
                )
                return
            self.histories.setdefault(str(line_history), lineno)
        count_problem = _turn_count_problem(prediction, scenario)
        if count_problem is not None:
            self.problems.append(f"{where}: {count_problem}")
            return
        sid = prediction["id"]
        texts = tuple(t["pred"] for t in prediction["turns"]) + (prediction["final_pred"],)
        flags = tuple(t["stopped"] for t in prediction["turns"]) + (prediction["final_stopped"],)
        has_flags = flags[-1] is not None
        if has_flags and self.with_flags is None:
            self.with_flags = (lineno, sid)
        if not has_flags and self.without_flags is None:
            self.without_flags = (lineno, sid)
        stopped = tuple(bool(f) for f in flags) if has_flags else None
        self.predictions[sid] = ReplayPrediction(texts, stopped, prediction["prompt_tail"], lineno)

    def check_file(self, scope_ids: Sequence[str]) -> None:
        """What is wrong with the file as a whole: stop flags on some lines only, a scenario
        in ``scope_ids`` without a line, two histories."""
        path = self.path
        if self.with_flags is not None and self.without_flags is not None:
            later, earlier = sorted([self.with_flags, self.without_flags], reverse=True)
            has = "has" if later == self.with_flags else "has no"
            self.problems.append(
                f"{path}:{later[0]}: scenario {later[1]!r}: field 'final_stopped': this line "
                f"{has} stop flags, line {earlier[0]} (scenario {earlier[1]!r}) does the "
                "opposite; a predictions file carries stop flags on every line or on none "
                "(two harnesses' files concatenated?)"
            )
        lacking = [sid for sid in scope_ids if sid not in self.first_line]
        # A line whose id could not be read may be the missing scenario's: report it alone.
        if lacking and not self.unidentified:
            self.problems.append(
                f"{path}: no line for {len(lacking)} scenario(s) of the benchmark "
                f"({self.benchmark.source}): {shown_ids(lacking)}"
            )
        if len(self.histories) > 1:
            (h1, l1), (h2, l2) = sorted(self.histories.items(), key=lambda kv: kv[1])[:2]
            self.problems.append(
                f"{path}:{l2}: field 'history': this line was predicted with history {h2}, "
                f"line {l1} with history {h1}; a predictions file holds one history "
                "(teacher-forced and free-running predictions concatenated?)"
            )


def load_replay_source(path: Path, benchmark: Benchmark, scope_ids: Sequence[str]) -> ReplaySource:
    """Read and check a predictions file against ``benchmark``; raise :class:`ReplayError`.

    Refused (one error listing the first problems, each with file, line, scenario and
    field): an unreadable or malformed line, a line without ``id``, an id the benchmark does
    not have, an id given twice, a missing or mistyped ``final_pred``/``turns``/``pred``, a
    number of turn predictions other than the scenario's assistant turns, stop flags on some
    outputs (or lines) but not others, and a scenario in ``scope_ids`` without a line.
    """
    try:
        with path.open(encoding="utf-8") as fh:
            lines = list(enumerate(fh, start=1))
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"{path}: cannot read the predictions file ({exc})") from None
    reader = _LineReader(path, benchmark, benchmark.by_id())
    for lineno, line in lines:
        reader.read(lineno, line)
    reader.check_file(scope_ids)
    history, said_by = _source_history(path, reader.histories)
    if reader.problems:
        raise ReplayError(
            f"cannot replay {path}: {len(reader.problems)} problem(s):\n  "
            + shown_list(reader.problems, sep="\n  ")
        )
    flags_kind = STOP_FLAGS_ABSENT if reader.without_flags is not None else STOP_FLAGS_PRESENT
    return ReplaySource(path, reader.predictions, flags_kind, history, said_by)


def _source_history(path: Path, histories: Mapping[str, int]) -> tuple[str | None, str]:
    """The history the predictions were made with and what says so: the ``metrics.json``
    beside them (a run of ours), else the lines' own ``history``; ``(None, "")`` when
    nothing does (another harness's file, or a run of ours older than free-running runs:
    teacher-forced, which the metrics then say by saying nothing)."""
    metrics = _metrics_beside(path)
    if metrics is not None:
        return history_of(metrics), f"{path.parent / METRICS} says so"
    if len(histories) == 1:
        return next(iter(histories)), "its lines say so"
    return None, ""


class ReplayDecoder:
    """Serves each scenario's stored outputs as its rollout (the file was checked already),
    as predictions of ``history`` (the run's, checked against the file's by
    :func:`check_replay_history`)."""

    path = "replay"

    def __init__(self, source: ReplaySource, history: str = HISTORY_TRUTH) -> None:
        self.source = source
        self.history = history

    def rollout(self, scenario: Scenario) -> Rollout:
        pred = self.source.predictions.get(scenario.id)
        if pred is None:  # out of the scope the file was checked for: a harness bug
            raise BenchmarkError(f"{self.source.path}: no prediction for scenario {scenario.id!r}")
        # Without stop flags the other harness decided where each output ended: stopped is
        # unknown (None), which scores as ended and records null, never a claimed True.
        flags: Sequence[bool | None] = (
            pred.stopped if pred.stopped is not None else [None] * len(pred.texts)
        )
        outputs = tuple(
            TurnOutput(text, flag, generated=False)
            for text, flag in zip(pred.texts, flags, strict=True)
        )
        return Rollout(outputs, self.path, pred.prompt_tail, history=self.history)

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """Everything is in memory already."""
