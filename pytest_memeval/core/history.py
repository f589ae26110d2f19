"""Which history a run's prompts hold: the truth (teacher-forced) or the model's own turns.

``--memeval-history truth`` (the default, ini ``memeval_history``): the prompt of assistant
message *k* holds the benchmark's true messages before it, so an early mistake never costs a
later turn; this measures per-turn skill (MT-Bench-101's "golden context").
``--memeval-history model``: every earlier assistant message is replaced by the model's own
prediction for it (free-running, as a deployed model runs and as MT-Bench feeds answers
back), exactly as its record stores it; system and user messages are unchanged. Both are
scored against the same truths.

This module holds what every layer needs to know about the two: their names and words, what
a record or a ``metrics.json`` says (older ones say nothing: teacher-forced), the text a
model's output becomes when it is fed back, the name of a free-running run's directory, and
whether two runs differ *only* in their history (the paired comparison of
``memeval compare RUN_TRUTH RUN_MODEL``). Plain data, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "HISTORIES",
    "HISTORY_MODEL",
    "HISTORY_TRUTH",
    "RUN_DIR_SUFFIX",
    "describe_history",
    "fed_back",
    "history_name",
    "history_of",
    "history_words",
    "other_differences",
    "teacher_forced_sibling_name",
]

HISTORY_TRUTH = "truth"
HISTORY_MODEL = "model"
#: the values of ``--memeval-history`` / ``memeval_history``, the default first
HISTORIES = (HISTORY_TRUTH, HISTORY_MODEL)
#: what a free-running run's directory name ends with: ``runs/<ckpt>@history-model``
RUN_DIR_SUFFIX = "@history-model"

_WORDS = {HISTORY_TRUTH: "teacher-forced", HISTORY_MODEL: "free-running"}
_DESCRIPTIONS = {
    HISTORY_TRUTH: "teacher-forced: each turn's prompt holds the true earlier turns",
    HISTORY_MODEL: "free-running: each turn's prompt holds the model's own earlier turns",
}


def history_words(history: str) -> str:
    """``teacher-forced`` or ``free-running``."""
    return _WORDS.get(history, history)


def describe_history(history: str) -> str:
    """``model (free-running: each turn's prompt holds the model's own earlier turns)``."""
    return f"{history} ({_DESCRIPTIONS.get(history, 'unknown')})"


def history_of(document: Mapping[str, object]) -> str:
    """The history of a record, a ``metrics.json`` or a journal header.

    Written by every run since free-running runs exist; one written before says nothing, and
    every run then was teacher-forced.
    """
    value = document.get("history", HISTORY_TRUTH)
    return value if isinstance(value, str) else HISTORY_TRUTH


def history_name(value: object, where: str) -> str:
    """``value`` checked as a history (``truth`` or ``model``); ``ValueError`` naming
    ``where`` (the option or ini key) otherwise."""
    if value not in HISTORIES:
        raise ValueError(
            f"{where} must be one of {', '.join(HISTORIES)} (truth: teacher-forced, the "
            f"default; model: free-running), got {value!r}"
        )
    return str(value)


def fed_back(text: str) -> str:
    """What a model's output becomes as a message of a later prompt (free-running): the
    decoded text (special tokens already skipped) with surrounding whitespace stripped, what a
    chat client sends back. A free-running record stores its outputs this way, so the record
    holds exactly what the later prompts held."""
    return text.strip()


def teacher_forced_sibling_name(name: str) -> str | None:
    """The directory name of the teacher-forced run beside a free-running one
    (``oracle@history-model`` -> ``oracle``); ``None`` when ``name`` is not a free-running
    run's default name."""
    if name.endswith(RUN_DIR_SUFFIX) and len(name) > len(RUN_DIR_SUFFIX):
        return name[: -len(RUN_DIR_SUFFIX)]
    return None


#: ``decoding`` fields that say how a run was decoded but not what it evaluated: the decode
#: path (fast and reference give the same predictions by contract) and the history itself.
_NOT_SETTINGS = ("path", "history")


def other_differences(
    a: Mapping[str, object], b: Mapping[str, object], *, labels: Sequence[str] = ("A", "B")
) -> list[str]:
    """What besides the history differs between two runs' ``metrics.json``: the benchmark,
    model and adapter fingerprints, the decoding settings (``max_new_tokens``, dtype,
    attention; not the decode path) and the profile kind. Empty: the two runs evaluate the
    same checkpoint on the same scenarios, and differ at most in their history.

    The decoding *fingerprint* is not compared: it covers the history (a free-running run's
    differs from the teacher-forced one's by design); the settings it hashes are compared
    one by one instead.
    """
    problems = []
    fps_a = a.get("fingerprints") or {}
    fps_b = b.get("fingerprints") or {}
    assert isinstance(fps_a, Mapping) and isinstance(fps_b, Mapping)
    for key in ("benchmark", "model", "adapter"):
        if fps_a.get(key) != fps_b.get(key):
            problems.append(
                f"{key} fingerprint ({labels[0]} {fps_a.get(key)}, {labels[1]} {fps_b.get(key)})"
            )
    dec_a = a.get("decoding") or {}
    dec_b = b.get("decoding") or {}
    assert isinstance(dec_a, Mapping) and isinstance(dec_b, Mapping)
    for key in sorted((set(dec_a) | set(dec_b)) - set(_NOT_SETTINGS)):
        if dec_a.get(key) != dec_b.get(key):
            problems.append(
                f"decoding {key} ({labels[0]} {dec_a.get(key)!r}, {labels[1]} {dec_b.get(key)!r})"
            )
    if a.get("kind") != b.get("kind"):
        problems.append(f"profile kind ({labels[0]} {a.get('kind')}, {labels[1]} {b.get('kind')})")
    return problems
