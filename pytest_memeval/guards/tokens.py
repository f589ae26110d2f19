"""The tokens contract: a scenario's rendered prompts as token ids, in a byte-stable text form.

:func:`prompt_tokens` renders a scenario exactly as the harness does (after the tokenizer's
chat template) into :class:`PromptTokens`; :func:`serialize_tokens` writes them in a compact
text form that a byte-exact snapshot keeps, so a template or tokenizer change fails even when
the message text is unchanged; :func:`parse_tokens` reads that form back and
:func:`describe_token_difference` words a changed snapshot in token terms. Nothing here
imports torch or transformers: the tokenizer is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.guards.differences import describe_byte_difference
from pytest_memeval.model.prompts import scenario_prompts

__all__ = [
    "ParsedTokens",
    "PromptTokens",
    "describe_token_difference",
    "parse_tokens",
    "prefix_break",
    "prompt_tokens",
    "serialize_tokens",
    "tokens_window",
]


@dataclass(frozen=True)
class PromptTokens:
    """The token ids a scenario's prompts are made of.

    ``conversation`` is the training rendering of all messages (no generation prompt);
    ``prompts`` holds, per assistant message index, the ids the harness feeds the model to
    predict it; ``vocab`` maps every id used to its token string (for readable diffs).
    """

    scenario_id: str
    conversation: tuple[int, ...]
    prompts: tuple[tuple[int, tuple[int, ...]], ...]
    vocab: Mapping[int, str]


def prompt_tokens(tokenizer: Any, scenario: Scenario) -> PromptTokens:
    """Render ``scenario`` exactly as the harness does (:mod:`pytest_memeval.model.prompts`),
    as token ids."""
    turns, full = scenario_prompts(tokenizer, scenario)
    conversation = tuple(full)
    prompts = tuple((p.message_index, p.ids) for p in turns)
    ids = sorted(set(conversation).union(*(set(p) for _, p in prompts)))
    tokens = tokenizer.convert_ids_to_tokens(ids)
    vocab = dict(zip(ids, map(str, tokens), strict=True))
    return PromptTokens(scenario.id, conversation, prompts, vocab)


def tokens_window(ids: Sequence[int], vocab: Mapping[int, str], at: int, n: int = 6) -> str:
    """The tokens around position ``at`` as text, the one at ``at`` in brackets."""
    start = max(0, at - n)
    shown = [vocab.get(i, f"#{i}") for i in ids[start : at + n + 1]]
    mark = at - start
    if mark < len(shown):
        shown[mark] = f"[{shown[mark]}]"
    else:
        shown.append("[<end>]")
    return ("… " if start else "") + " ".join(shown) + (" …" if at + n + 1 < len(ids) else "")


def prefix_break(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where ``a`` stops being a prefix of ``b`` (``None`` if it is one)."""
    for i, x in enumerate(a):
        if i >= len(b) or b[i] != x:
            return i
    return None


_TOKENS_HEADER = "# pytest-memeval prompt tokens v1"


def serialize_tokens(tokens: PromptTokens, variant: str) -> bytes:
    """A compact, line-oriented, byte-stable text form of ``tokens``.

    The conversation's ids are written once; each prompt as the length of the conversation
    prefix it shares plus the ids that follow instead (none when the prefix property holds),
    so the file grows linearly with the conversation, not quadratically.
    """
    conv = tokens.conversation
    out = [
        _TOKENS_HEADER,
        f"# scenario {tokens.scenario_id} ({variant}); each prompt line: message index, the "
        "length of the conversation prefix it shares, '+' any ids that follow instead",
        f"conversation {len(conv)}: " + " ".join(map(str, conv)),
    ]
    for k, ids in tokens.prompts:
        shared = prefix_break(ids, conv)
        shared = len(ids) if shared is None else shared
        line = f"prompt messages[{k}] {shared}"
        if shared < len(ids):
            line += " + " + " ".join(map(str, ids[shared:]))
        out.append(line)
    for i in sorted(tokens.vocab):
        out.append(f"token {i} {json.dumps(tokens.vocab[i], ensure_ascii=False)}")
    return ("\n".join(out) + "\n").encode("utf-8")


@dataclass(frozen=True)
class ParsedTokens:
    """The content of a serialised token snapshot (prompts rebuilt from the conversation)."""

    conversation: tuple[int, ...]
    prompts: dict[int, tuple[int, ...]]
    vocab: dict[int, str]


def parse_tokens(data: bytes) -> ParsedTokens:
    """Parse :func:`serialize_tokens` output; ``ValueError`` if it is not that format."""
    conversation: tuple[int, ...] | None = None
    prompts: dict[int, tuple[int, ...]] = {}
    vocab: dict[int, str] = {}
    for line in data.decode("utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        kind, _, rest = line.partition(" ")
        if kind == "conversation":
            _, _, ids = rest.partition(": ")
            conversation = tuple(int(x) for x in ids.split())
        elif kind == "prompt":
            if conversation is None:
                raise ValueError("a prompt line before the conversation line")
            name, _, spec = rest.partition(" ")
            shared, _, extra = spec.partition(" + ")
            index = int(name.removeprefix("messages[").removesuffix("]"))
            prompts[index] = conversation[: int(shared)] + tuple(int(x) for x in extra.split())
        elif kind == "token":
            tid, _, text = rest.partition(" ")
            vocab[int(tid)] = json.loads(text)
        else:
            raise ValueError(f"unknown line {line[:40]!r}")
    if conversation is None:
        raise ValueError("no conversation line")
    return ParsedTokens(conversation, prompts, vocab)


def _snapshot_bytes_diff(snapshot: bytes, now: bytes) -> list[str]:
    return describe_byte_difference(snapshot, now, expected_label="snapshot", actual_label="now")


def describe_token_difference(snapshot: bytes, now: bytes) -> list[str]:
    """Lines describing how two serialised token snapshots differ, in token terms."""
    try:
        old, new = parse_tokens(snapshot), parse_tokens(now)
    except (ValueError, UnicodeDecodeError):
        return _snapshot_bytes_diff(snapshot, now)
    lines = [
        *_conversation_difference(old, new),
        *_prompts_difference(old, new),
        *_vocab_difference(old, new),
    ]
    if not lines:
        lines = _snapshot_bytes_diff(snapshot, now)
    return lines


def _conversation_difference(old: ParsedTokens, new: ParsedTokens) -> list[str]:
    """The first token where the conversation's rendering changed, with context."""
    at = prefix_break(old.conversation, new.conversation)
    if at is None and len(new.conversation) > len(old.conversation):
        at = len(old.conversation)
    if at is None:
        return []
    was = (
        f"{old.conversation[at]} {old.vocab.get(old.conversation[at], '?')!r}"
        if at < len(old.conversation)
        else "its end"
    )
    now_tok = (
        f"{new.conversation[at]} {new.vocab.get(new.conversation[at], '?')!r}"
        if at < len(new.conversation)
        else "its end"
    )
    return [
        f"conversation token {at} differs: snapshot {was}, now {now_tok} "
        f"({len(old.conversation)} vs {len(new.conversation)} tokens)",
        f"  snapshot: {tokens_window(old.conversation, old.vocab, at)}",
        f"  now     : {tokens_window(new.conversation, new.vocab, at)}",
    ]


def _prompts_difference(old: ParsedTokens, new: ParsedTokens) -> list[str]:
    """The prompts that changed (the first one's tokens shown), and the message indices that
    are prompted on one side only."""
    lines: list[str] = []
    changed = [k for k in old.prompts if k in new.prompts and old.prompts[k] != new.prompts[k]]
    if changed:
        k = changed[0]
        a, b = old.prompts[k], new.prompts[k]
        p = prefix_break(a, b)
        p = len(a) if p is None else p
        lines.append(
            f"{len(changed)} prompt(s) differ; first: messages[{k}] at token {p} "
            f"({len(a)} vs {len(b)} tokens)"
        )
        lines.append(f"  snapshot: {tokens_window(a, old.vocab, p)}")
        lines.append(f"  now     : {tokens_window(b, new.vocab, p)}")
    gone = sorted(set(old.prompts) - set(new.prompts))
    added = sorted(set(new.prompts) - set(old.prompts))
    if gone or added:
        lines.append(
            f"prompted message indices changed: removed {gone or 'none'}, added {added or 'none'}"
        )
    return lines


def _vocab_difference(old: ParsedTokens, new: ParsedTokens) -> list[str]:
    """The token ids on both sides whose token string changed (the first one shown)."""
    remapped = [i for i in old.vocab if i in new.vocab and old.vocab[i] != new.vocab[i]]
    if not remapped:
        return []
    i = remapped[0]
    return [
        f"{len(remapped)} token id(s) now decode differently; first: {i} was "
        f"{old.vocab[i]!r}, now {new.vocab[i]!r}"
    ]
