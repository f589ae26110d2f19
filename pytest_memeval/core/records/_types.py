"""The per-scenario side of the results schema: what a decoder hands on, the record it becomes.

* decoder outputs: :class:`TurnOutput`, :class:`Rollout`;
* the per-scenario record (one line of ``predictions.jsonl``, built by
  :func:`pytest_memeval.core.scoring.score`): :class:`Record` with its :class:`Turn` entries;
* a line of a predictions file to replay (``kind = "replay"``): :class:`Prediction`.

Plain types only; the checks derived from them are in :mod:`._validate`. Import them
from :mod:`pytest_memeval.core.records`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from pytest_memeval.core.history import HISTORY_TRUTH

__all__ = [
    "GRANULARITIES",
    "SCHEMA_VERSION",
    "Overlong",
    "Prediction",
    "PredictionTurn",
    "Record",
    "Rollout",
    "Turn",
    "TurnOutput",
]

#: Version of the results schema (``predictions.jsonl`` records and ``metrics.json``'s
#: ``schema_version``); bump on any incompatible change (docs/results-schema.md).
SCHEMA_VERSION = 1

#: How a turn is scored: against ``memory_chain[i]``, the message itself (no chain), or not
#: at all (the turn count differs from the chain).
GRANULARITIES = ("memory_chain", "message", "unaligned")


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
