"""Byte guards: model-free proof that evaluation prompts equal training prompts.

Three contracts, each a pure function here (the pytest surface is
:mod:`pytest_memeval.guard_tests`):

* **reference** — the records the harness builds for a data variant, serialised with
  :func:`~pytest_memeval.core.benchmark.dump_record`, equal that variant's training-format file
  byte for byte. A difference names the scenario, the message index, the first differing byte
  offset and a short context on both sides.
* **tokens** — the rendered prompts (after the tokenizer's chat template) as token ids, in a
  compact text form (:func:`serialize_tokens`) that a byte-exact snapshot keeps, so a template
  or tokenizer change fails even when the message text is unchanged.
* **prefix** — the prompt of each assistant turn is a token prefix of the next turn's prompt
  and of the training rendering of the whole conversation (what the model was trained on).

Guarded variants are configured in ``[tool.memeval.guards.NAME]`` tables next to the
checkpoint profiles (see :func:`load_guard_specs`); no checkpoint is loaded, only the
tokenizer. Nothing here imports torch or transformers at module level.
"""

from __future__ import annotations

import codecs
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.formatting import shown_ids
from pytest_memeval.core.profiles import ProfileError, memeval_table
from pytest_memeval.model.prompts import scenario_prompts

__all__ = [
    "SNAPSHOT_KINDS",
    "GuardError",
    "GuardSpec",
    "PromptTokens",
    "ReferenceFile",
    "check_prefix",
    "check_reference_file",
    "check_reference_line",
    "describe_byte_difference",
    "describe_order_difference",
    "describe_record_difference",
    "describe_token_difference",
    "first_difference",
    "load_guard_specs",
    "parse_tokens",
    "prompt_tokens",
    "read_reference",
    "serialize_tokens",
]

#: What a guard table may snapshot: the built records (and their order), the prompt tokens.
SNAPSHOT_KINDS = ("records", "tokens")
_GUARD_KEYS = {"profile", "reference", "snapshot", "tokenizer", "prefix"}

#: Bytes of context shown on each side of a first difference.
CONTEXT = 24


class GuardError(ValueError):
    """A guard table is malformed or names something that does not exist.

    The message names the file, the table and the key.
    """


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class GuardSpec:
    """One ``[tool.memeval.guards.NAME]`` table: a data variant and the guards it gets."""

    name: str
    profile: str
    source: Path
    reference: Path | None = None
    snapshot: tuple[str, ...] = ()
    tokenizer: Path | None = None
    prefix: bool = True

    @property
    def where(self) -> str:
        return f"{self.source}: [tool.memeval.guards.{self.name}]"

    @property
    def needs_tokenizer(self) -> bool:
        return self.prefix or "tokens" in self.snapshot


def load_guard_specs(path: Path) -> list[GuardSpec]:
    """The guard tables of ``path`` (a pyproject.toml), in file order; ``[]`` without any.

    Each table::

        [tool.memeval.guards.baseline]
        profile = "baseline"                 # a [tool.memeval.ckpt.*] profile (default: NAME)
        reference = "data/baseline/val.jsonl"  # training-format file, compared byte for byte
        snapshot = ["records", "tokens"]     # byte-exact snapshots (default: none)
        tokenizer = "checkpoint/base"        # default: the profile's model directory
        prefix = true                        # per-turn token-prefix property (default: true)

    Paths are relative to the file's directory. Errors name the file, the table and the key.
    """
    try:
        tables = memeval_table(path, "guards")
    except ProfileError as exc:
        raise GuardError(str(exc)) from None
    return [_spec(name, raw, path) for name, raw in tables.items()]


def _spec(name: str, raw: Any, path: Path) -> GuardSpec:
    where = f"{path}: [tool.memeval.guards.{name}]"
    if not isinstance(raw, dict):
        raise GuardError(f'{where} must be a table (e.g. profile = "{name}")')
    unknown = set(raw) - _GUARD_KEYS
    if unknown:
        raise GuardError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_GUARD_KEYS)})"
        )
    root = path.parent

    def optional_path(key: str) -> Path | None:
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise GuardError(f"{where}: {key!r} must be a path string, got {value!r}")
        return (root / value).resolve()

    profile = raw.get("profile", name)
    if not isinstance(profile, str) or not profile:
        raise GuardError(f"{where}: 'profile' must be a profile name, got {profile!r}")
    snapshot = raw.get("snapshot", [])
    if not isinstance(snapshot, list) or not all(s in SNAPSHOT_KINDS for s in snapshot):
        raise GuardError(
            f"{where}: 'snapshot' must be a list drawn from {list(SNAPSHOT_KINDS)}, "
            f"got {snapshot!r}"
        )
    prefix = raw.get("prefix", True)
    if not isinstance(prefix, bool):
        raise GuardError(f"{where}: 'prefix' must be true or false, got {prefix!r}")
    return GuardSpec(
        name=name,
        profile=profile,
        source=path,
        reference=optional_path("reference"),
        snapshot=tuple(dict.fromkeys(snapshot)),
        tokenizer=optional_path("tokenizer"),
        prefix=prefix,
    )


# --------------------------------------------------------------------------- bytes
def first_difference(a: bytes, b: bytes) -> int | None:
    """Offset of the first byte where ``a`` and ``b`` differ (or where one ends); ``None``
    when they are equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _show(data: bytes) -> str:
    """Bytes as readable text: UTF-8 decoded, line ends and tabs made visible."""
    text = data.decode("utf-8", "backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _window(data: bytes, offset: int, width: int) -> tuple[str, str]:
    """``(before, after)`` shown text around ``offset``, cut at UTF-8 character bounds."""
    start = max(0, offset - width)
    while 0 < start < offset and _is_continuation(data[start]):
        start += 1
    end = min(len(data), offset + width)
    while offset < end < len(data) and _is_continuation(data[end]):
        end -= 1
    before = ("…" if start > 0 else "") + _show(data[start:offset])
    after = _show(data[offset:end]) + ("…" if end < len(data) else "")
    return before, after


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return line, col


def describe_byte_difference(
    expected: bytes,
    actual: bytes,
    *,
    expected_label: str = "expected",
    actual_label: str = "actual",
    width: int = CONTEXT,
    unit: str = "",
) -> list[str]:
    """Lines naming the first differing byte offset, with ``width`` bytes of context on both
    sides and a caret under the difference. ``unit`` names what the offset counts in."""
    offset = first_difference(expected, actual)
    if offset is None:
        return []
    line, col = _line_col(expected, offset)
    where = f"first differing byte at offset {offset}"
    if unit:
        where += f" of {unit}"
    if expected.count(b"\n", 0, len(expected) - 1) or actual.count(b"\n", 0, len(actual) - 1):
        where += f" (line {line}, column {col})"
    if offset >= len(expected) or offset >= len(actual):
        shorter = expected_label if offset >= len(expected) else actual_label
        where += f"; the {shorter} ends there ({len(expected)} vs {len(actual)} bytes)"
    pad = max(len(expected_label), len(actual_label))
    lines = [where]
    caret_at = 0
    for label, data in ((expected_label, expected), (actual_label, actual)):
        before, after = _window(data, offset, width)
        lines.append(f"  {label.ljust(pad)}: {before}{after or '<end>'}")
        caret_at = max(caret_at, len(before))
    lines.append("  " + " " * (pad + 2 + caret_at) + "^")
    return lines


def _locate(expected: Any, actual: Any) -> str:
    """Where two decoded records first differ, in record terms (message index, field)."""
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return "the line is not a JSON object on one side"
    if expected.get("id") != actual.get("id"):
        return f"field 'id' differs ({expected.get('id')!r} vs {actual.get('id')!r})"
    em, am = expected.get("messages"), actual.get("messages")
    if isinstance(em, list) and isinstance(am, list):
        for i, (e, a) in enumerate(zip(em, am, strict=False)):
            if e != a:
                role = e.get("role") if isinstance(e, dict) else None
                other = a.get("role") if isinstance(a, dict) else None
                roles = f"{role}" if role == other else f"{role} vs {other}"
                return f"messages[{i}] ({roles}) differs"
        if len(em) != len(am):
            return (
                f"the message count differs ({len(em)} vs {len(am)}); first unmatched is "
                f"messages[{min(len(em), len(am))}]"
            )
    elif em != am:
        return "field 'messages' differs"
    ec, ac = expected.get("memory_chain"), actual.get("memory_chain")
    if ec != ac:
        if isinstance(ec, list) and isinstance(ac, list):
            for i, (e, a) in enumerate(zip(ec, ac, strict=False)):
                if e != a:
                    return f"memory_chain[{i}] differs"
            return f"memory_chain length differs ({len(ec)} vs {len(ac)})"
        return "field 'memory_chain' differs"
    if set(expected) != set(actual):
        return f"fields differ ({sorted(expected)} vs {sorted(actual)})"
    if list(expected) != list(actual):
        return f"key order differs ({list(expected)} vs {list(actual)})"
    return "same JSON values, different serialisation (escaping, spacing or line end)"


def describe_record_difference(
    expected: bytes,
    actual: bytes,
    *,
    expected_label: str = "expected",
    actual_label: str = "actual",
) -> list[str]:
    """A record-level description of two differing JSONL lines: which message (or field)
    differs, then the first differing byte offset and its context."""
    try:
        located = _locate(json.loads(expected), json.loads(actual))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        located = f"a line is not valid JSON ({exc})"
    return [
        located,
        *describe_byte_difference(
            expected,
            actual,
            expected_label=expected_label,
            actual_label=actual_label,
            unit="the line",
        ),
    ]


# --------------------------------------------------------------------------- reference
@dataclass(frozen=True)
class ReferenceLine:
    """One line of a reference file: its number, its bytes (with the line end) and id."""

    lineno: int
    data: bytes
    id: str | None
    error: str | None = None


@dataclass(frozen=True)
class ReferenceFile:
    """A training-format reference file, kept as raw bytes and split into lines."""

    path: Path
    raw: bytes
    lines: tuple[ReferenceLine, ...]
    #: how messages name the file (e.g. relative to the project root)
    name: str = ""

    def __str__(self) -> str:
        return self.name or str(self.path)

    def by_id(self) -> dict[str, ReferenceLine]:
        out: dict[str, ReferenceLine] = {}
        for line in self.lines:
            if line.id is not None:
                out.setdefault(line.id, line)
        return out


def read_reference(path: Path, name: str = "") -> ReferenceFile:
    """Read a training-format JSONL file as bytes; ``GuardError`` if it cannot be read.

    ``name`` is how failure messages call the file (default: ``path``).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GuardError(f"{path}: reference file not found") from None
    except OSError as exc:
        raise GuardError(f"{path}: cannot read reference file ({exc.strerror})") from None
    lines: list[ReferenceLine] = []
    for lineno, data in enumerate(raw.splitlines(keepends=True), start=1):
        text = data.rstrip(b"\r\n")
        sid: str | None = None
        error: str | None = None
        if lineno == 1 and text.startswith(codecs.BOM_UTF8):
            text = text[len(codecs.BOM_UTF8) :]
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            error = f"not a JSON record ({exc})" if text.strip() else "blank line"
        else:
            if isinstance(obj, dict) and isinstance(obj.get("id"), str):
                sid = obj["id"]
            else:
                error = "not a record with a string 'id'"
        lines.append(ReferenceLine(lineno, data, sid, error))
    return ReferenceFile(path, raw, tuple(lines), name)


def check_reference_line(
    variant: str, scenario_id: str, built: bytes, reference: ReferenceFile
) -> str | None:
    """Compare one built record line with the reference line of the same scenario id.

    Returns ``None`` when they are byte-identical, else a readable failure message.
    """
    ref = reference.by_id().get(scenario_id)
    if ref is None:
        return (
            f"{variant} scenario {scenario_id!r}: built by the harness but absent from the "
            f"reference {reference}"
        )
    if ref.data == built:
        return None
    head = (
        f"{variant} scenario {scenario_id!r}: the built record differs from the reference "
        f"{reference}:{ref.lineno}"
    )
    lines = describe_record_difference(
        ref.data, built, expected_label="reference", actual_label="built"
    )
    return "\n".join([head, *("  " + line for line in lines)])


def check_reference_file(
    variant: str, built: Sequence[tuple[str, bytes]], reference: ReferenceFile
) -> str | None:
    """Compare the whole built variant (``(id, line)`` in order) with the reference file.

    Checks what the per-scenario comparison cannot see: line framing (BOM, CRLF, final
    newline, blank lines), scenarios only on one side, duplicates and order. Returns ``None``
    when the files are byte-identical, else a readable message (one problem per line).
    """
    joined = b"".join(line for _, line in built)
    if joined == reference.raw:
        return None
    path = str(reference)
    problems: list[str] = []
    if reference.raw.startswith(codecs.BOM_UTF8):
        problems.append(f"{path}:1: starts with a UTF-8 byte-order mark; the build writes none")
    crlf = [ln.lineno for ln in reference.lines if ln.data.endswith(b"\r\n")]
    if crlf:
        problems.append(
            f"{path}: {len(crlf)} line(s) end with CRLF (first: line {crlf[0]}); the training "
            "format ends lines with LF only"
        )
    if reference.raw and not reference.raw.endswith(b"\n"):
        problems.append(f"{path}:{len(reference.lines)}: the last line has no final newline")
    for ln in reference.lines:
        if ln.error is not None:
            problems.append(f"{path}:{ln.lineno}: {ln.error}")
    ref_ids = [ln.id for ln in reference.lines if ln.id is not None]
    dups = [i for i, n in Counter(ref_ids).items() if n > 1]
    if dups:
        problems.append(f"{path}: duplicate scenario id(s) {shown_ids(dups)}")
    built_ids = [sid for sid, _ in built]
    only_ref = [i for i in dict.fromkeys(ref_ids) if i not in set(built_ids)]
    only_built = [i for i in built_ids if i not in set(ref_ids)]
    if only_ref:
        problems.append(f"{len(only_ref)} scenario(s) only in the reference: {shown_ids(only_ref)}")
    if only_built:
        problems.append(f"{len(only_built)} scenario(s) only in the build: {shown_ids(only_built)}")
    common = set(ref_ids) & set(built_ids)
    ref_order = [i for i in dict.fromkeys(ref_ids) if i in common]
    built_order = [i for i in built_ids if i in common]
    if ref_order != built_order:
        k = next(i for i, (a, b) in enumerate(zip(ref_order, built_order, strict=False)) if a != b)
        lineno = reference.by_id()[ref_order[k]].lineno
        problems.append(
            f"scenario order differs: {path}:{lineno} holds {ref_order[k]!r} where the build has "
            f"{built_order[k]!r} (reference order ...{shown_ids(ref_order[k : k + 4])}; "
            f"build order ...{shown_ids(built_order[k : k + 4])})"
        )
    by_id = reference.by_id()
    differing = [(sid, data) for sid, data in built if sid in by_id and by_id[sid].data != data]
    if differing:
        ids = [sid for sid, _ in differing]
        problems.append(f"{len(differing)} scenario(s) differ byte-wise: {shown_ids(ids)}; first:")
        sid, data = differing[0]
        detail = check_reference_line(variant, sid, data, reference)
        if detail:
            problems.extend("  " + line for line in detail.splitlines())
    if not problems:
        # Only reachable for framing the checks above do not name; show the raw offset.
        problems.extend(
            describe_byte_difference(
                reference.raw,
                joined,
                expected_label="reference",
                actual_label="built",
                unit="the file",
            )
        )
    head = f"{variant}: the built records differ from the training-format reference {path}"
    return "\n".join([head, *("  " + p for p in problems)])


def describe_order_difference(expected: Sequence[str], actual: Sequence[str]) -> list[str]:
    """Lines describing how two scenario-id sequences differ (first position, one-sided ids)."""
    lines: list[str] = []
    gone = [i for i in expected if i not in set(actual)]
    new = [i for i in actual if i not in set(expected)]
    if gone:
        lines.append(f"{len(gone)} scenario(s) no longer built: {shown_ids(gone)}")
    if new:
        lines.append(f"{len(new)} scenario(s) newly built: {shown_ids(new)}")
    exp = [i for i in expected if i in set(actual)]
    act = [i for i in actual if i in set(expected)]
    if exp != act:
        k = next(i for i, (a, b) in enumerate(zip(exp, act, strict=False)) if a != b)
        lines.append(
            f"order differs at position {k + 1}: the snapshot has {exp[k]!r}, the build "
            f"{act[k]!r} (snapshot ...{shown_ids(exp[k : k + 4])}; "
            f"build ...{shown_ids(act[k : k + 4])})"
        )
    return lines


# --------------------------------------------------------------------------- tokens
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


def _tokens_window(ids: Sequence[int], vocab: Mapping[int, str], at: int, n: int = 6) -> str:
    start = max(0, at - n)
    shown = [vocab.get(i, f"#{i}") for i in ids[start : at + n + 1]]
    mark = at - start
    if mark < len(shown):
        shown[mark] = f"[{shown[mark]}]"
    else:
        shown.append("[<end>]")
    return ("… " if start else "") + " ".join(shown) + (" …" if at + n + 1 < len(ids) else "")


def _not_prefix(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where ``a`` stops being a prefix of ``b`` (``None`` if it is one)."""
    for i, x in enumerate(a):
        if i >= len(b) or b[i] != x:
            return i
    return None


def check_prefix(
    variant: str,
    tokens: PromptTokens,
    *,
    unk_token_id: int | None = None,
    bos_token_id: int | None = None,
) -> str | None:
    """The prefix property of one scenario's prompts; ``None`` when it holds.

    Each assistant turn's prompt must be a token prefix of the next turn's prompt, and the
    last (the final query's) a prefix of the conversation's training rendering: evaluation
    then feeds the model exactly the tokens it was trained on. Also refuses a doubled BOS
    and the unknown token (a word the tokenizer cannot encode).
    """
    sid = tokens.scenario_id
    steps: list[tuple[str, tuple[int, ...]]] = []
    n = len(tokens.prompts)
    for t, (k, ids) in enumerate(tokens.prompts):
        label = f"turn {t} (messages[{k}])" if t < n - 1 else f"the final query (messages[{k}])"
        steps.append((f"the prompt of {label}", ids))
    steps.append(("the training rendering of the whole conversation", tokens.conversation))
    for label, ids in steps:
        if bos_token_id is not None and ids[:2] == (bos_token_id, bos_token_id):
            return (
                f"{variant} scenario {sid!r}: {label} starts with a doubled BOS token "
                f"({bos_token_id} {tokens.vocab.get(bos_token_id)!r} twice): the chat template "
                "(or the data) writes it twice, while the model was trained on one (the "
                "harness encodes the rendered text without adding special tokens)"
            )
        if unk_token_id is not None and unk_token_id in ids:
            at = ids.index(unk_token_id)
            return (
                f"{variant} scenario {sid!r}: {label} contains the unknown token at position "
                f"{at}: the tokenizer cannot encode a word of the data\n"
                f"  {_tokens_window(ids, tokens.vocab, at)}"
            )
    for (label_a, a), (label_b, b) in pairwise(steps):
        pos = _not_prefix(a, b)
        if pos is None:
            continue
        got = f"{a[pos]} {tokens.vocab.get(a[pos], '?')!r}"
        there = f"{b[pos]} {tokens.vocab.get(b[pos], '?')!r}" if pos < len(b) else "its end"
        return "\n".join(
            [
                f"{variant} scenario {sid!r}: {label_a} is not a token prefix of {label_b}",
                f"  first difference at token {pos}: {got} vs {there}",
                f"  {label_a}: {_tokens_window(a, tokens.vocab, pos)}",
                f"  {label_b}: {_tokens_window(b, tokens.vocab, pos)}",
            ]
        )
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
        shared = _not_prefix(ids, conv)
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
    lines: list[str] = []
    at = _not_prefix(old.conversation, new.conversation)
    if at is None and len(new.conversation) > len(old.conversation):
        at = len(old.conversation)
    if at is not None:
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
        lines += [
            f"conversation token {at} differs: snapshot {was}, now {now_tok} "
            f"({len(old.conversation)} vs {len(new.conversation)} tokens)",
            f"  snapshot: {_tokens_window(old.conversation, old.vocab, at)}",
            f"  now     : {_tokens_window(new.conversation, new.vocab, at)}",
        ]
    changed = [k for k in old.prompts if k in new.prompts and old.prompts[k] != new.prompts[k]]
    if changed:
        k = changed[0]
        a, b = old.prompts[k], new.prompts[k]
        p = _not_prefix(a, b)
        p = len(a) if p is None else p
        lines.append(
            f"{len(changed)} prompt(s) differ; first: messages[{k}] at token {p} "
            f"({len(a)} vs {len(b)} tokens)"
        )
        lines.append(f"  snapshot: {_tokens_window(a, old.vocab, p)}")
        lines.append(f"  now     : {_tokens_window(b, new.vocab, p)}")
    gone = sorted(set(old.prompts) - set(new.prompts))
    added = sorted(set(new.prompts) - set(old.prompts))
    if gone or added:
        lines.append(
            f"prompted message indices changed: removed {gone or 'none'}, added {added or 'none'}"
        )
    remapped = [i for i in old.vocab if i in new.vocab and old.vocab[i] != new.vocab[i]]
    if remapped:
        i = remapped[0]
        lines.append(
            f"{len(remapped)} token id(s) now decode differently; first: {i} was "
            f"{old.vocab[i]!r}, now {new.vocab[i]!r}"
        )
    if not lines:
        lines = _snapshot_bytes_diff(snapshot, now)
    return lines


def join_lines(lines: Iterable[str]) -> bytes:
    """``lines`` as LF-terminated UTF-8 bytes (the order snapshot's format)."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8")
