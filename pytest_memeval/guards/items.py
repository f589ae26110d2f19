"""The byte-guard items: model-free contracts that run in a plain ``pytest`` (no ``--ckpt``).

Import them into a test module of your project::

    # contracts/test_guards.py
    from pytest_memeval.guard_tests import (  # noqa: F401
        test_prompt_prefix,
        test_prompt_tokens,
        test_record_snapshot,
        test_reference_bytes,
        test_reference_file,
        test_scenario_order,
    )

and declare the guarded data variants in ``pyproject.toml`` (see
:func:`pytest_memeval.guards.specs.load_guard_specs`)::

    [tool.memeval.guards.baseline]
    profile = "baseline"
    reference = "data/baseline/val.jsonl"
    snapshot = ["records", "tokens"]

The plugin parametrizes each function over the variants whose table enables its guard, and
per scenario where the guard is per scenario (``test_reference_bytes[baseline-s0001]``). Your
own guard test can do the same: mark it ``@pytest.mark.memeval_guard(KIND)`` and take the
``memeval_guard`` argument (a :class:`GuardCase`); ``KIND`` is one of :data:`GUARD_KINDS`.

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_memeval.compat.syrupy import disable_unused_snapshot_check
from pytest_memeval.core.benchmark import Benchmark, Scenario, dump_record
from pytest_memeval.core.profiles import resolve_profile
from pytest_memeval.guards.order import join_lines
from pytest_memeval.guards.prefix import check_prefix
from pytest_memeval.guards.reference import (
    ReferenceFile,
    check_reference_file,
    check_reference_line,
    read_reference,
)
from pytest_memeval.guards.snapshot import OrderSnapshot, RecordSnapshot, TokenSnapshot
from pytest_memeval.guards.specs import GuardError, GuardSpec, load_guard_specs
from pytest_memeval.guards.tokens import PromptTokens, prompt_tokens, serialize_tokens
from pytest_memeval.model.checks import CheckpointError
from pytest_memeval.model.gguf import convert_gguf, is_gguf
from pytest_memeval.runtime.session import cache_dir, load_benchmark, profiles_file

if TYPE_CHECKING:
    from syrupy.assertion import SnapshotAssertion

    from pytest_memeval.guards.snapshot import ByteSnapshot

__all__ = [
    "GUARD_KINDS",
    "GuardCase",
    "GuardVariant",
    "test_prompt_prefix",
    "test_prompt_tokens",
    "test_record_snapshot",
    "test_reference_bytes",
    "test_reference_file",
    "test_scenario_order",
]

#: Guard kinds: ``kind -> (per scenario?, what a guard table needs to enable it)``.
GUARD_KINDS: dict[str, tuple[bool, str]] = {
    "reference_file": (False, "reference = PATH"),
    "reference": (True, "reference = PATH"),
    "scenario_order": (False, 'snapshot = ["records"]'),
    "record_snapshot": (True, 'snapshot = ["records"]'),
    "prefix": (True, "prefix = true (the default) and a tokenizer"),
    "tokens": (True, 'snapshot = ["tokens"]'),
}


def _enabled(kind: str, spec: GuardSpec) -> bool:
    if kind in ("reference_file", "reference"):
        return spec.reference is not None
    if kind in ("scenario_order", "record_snapshot"):
        return "records" in spec.snapshot
    if kind == "prefix":
        return spec.prefix
    return "tokens" in spec.snapshot


@dataclass
class GuardVariant:
    """A guarded data variant: its table, the records the harness builds, lazy extras."""

    spec: GuardSpec
    benchmark: Benchmark
    #: scenario id -> its built line (``dump_record`` of what the harness evaluates), in order
    lines: dict[str, bytes]
    tokenizer_dir: Path | None
    #: where a GGUF file named as the tokenizer's source is converted (core/cache.py)
    cache_root: Path | None = None
    _reference: ReferenceFile | None = None
    _tokenizer: Any = None
    _tokens: dict[str, PromptTokens] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def reference(self) -> ReferenceFile:
        """The variant's training-format reference file (read once per process)."""
        if self._reference is None:
            assert self.spec.reference is not None
            try:
                path = self.spec.reference
                root = self.spec.source.parent.resolve()
                name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
                self._reference = read_reference(path, name)
            except GuardError as exc:
                raise GuardError(f"{exc} ({self.spec.where}, key 'reference')") from None
        return self._reference

    def tokenizer(self) -> Any:
        """The tokenizer the prompts are rendered with (loaded once per process)."""
        if self._tokenizer is None:
            directory = self.tokenizer_dir
            if is_gguf(directory) and self.cache_root is not None:
                # A GGUF model: its tokenizer from the file's conversion (made once).
                assert directory is not None
                try:
                    directory = convert_gguf(directory, self.cache_root).directory
                except CheckpointError as exc:
                    raise GuardError(f"{self.spec.where}: {exc}") from None
            if directory is None or not directory.is_dir():
                raise GuardError(
                    f"{self.spec.where}: tokenizer directory not found: {directory} "
                    "(key 'tokenizer', default: the profile's 'tokenizer' or 'model')"
                )
            # Deferred: transformers takes seconds; only a guard that renders prompts needs it.
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(
                    str(directory), trust_remote_code=False, local_files_only=True
                )
            except (OSError, ValueError) as exc:
                raise GuardError(
                    f"{self.spec.where}: cannot load the tokenizer in {directory}: {exc}"
                ) from None
        return self._tokenizer

    def tokens(self, scenario: Scenario) -> PromptTokens:
        """The scenario's prompts as token ids, rendered once per process."""
        cached = self._tokens.get(scenario.id)
        if cached is None:
            cached = self._tokens[scenario.id] = prompt_tokens(self.tokenizer(), scenario)
        return cached


@dataclass(frozen=True)
class GuardCase:
    """What one guard item checks: a variant, and its scenario for per-scenario guards."""

    variant: GuardVariant
    scenario: Scenario | None
    #: the test module, relative to the rootdir (for the ``--snapshot-update`` hint)
    module: str

    @property
    def label(self) -> str:
        if self.scenario is None:
            return self.variant.name
        return f"{self.variant.name} scenario {self.scenario.id!r}"

    @property
    def built_line(self) -> bytes:
        assert self.scenario is not None
        return self.variant.lines[self.scenario.id]


GUARDS_KEY = pytest.StashKey[list[GuardVariant]]()


def _load_variant(config: pytest.Config, spec: GuardSpec) -> GuardVariant:
    try:
        profile = resolve_profile(spec.profile, spec.source)
    except ValueError as exc:
        raise GuardError(f"{spec.where}: key 'profile': {exc}") from None
    try:
        benchmark = load_benchmark(config, profile)
    except ValueError as exc:
        raise GuardError(f"{spec.where}: building profile {spec.profile!r}: {exc}") from None
    tokenizer_dir = spec.tokenizer or profile.tokenizer or profile.model
    if spec.needs_tokenizer and tokenizer_dir is None:
        raise GuardError(
            f"{spec.where}: profile {spec.profile!r} has no model directory; set 'tokenizer' "
            '(or prefix = false and no "tokens" snapshot)'
        )
    lines = {s.id: dump_record(s.to_record()).encode("utf-8") for s in benchmark.scenarios}
    return GuardVariant(spec, benchmark, lines, tokenizer_dir, cache_dir(config))


def guard_variants(config: pytest.Config) -> list[GuardVariant]:
    """The guarded variants of this run, built once per process (``GuardError`` if bad)."""
    cached = config.stash.get(GUARDS_KEY, None)
    if cached is None:
        specs = load_guard_specs(profiles_file(config))
        cached = config.stash[GUARDS_KEY] = [_load_variant(config, s) for s in specs]
    return cached


# --------------------------------------------------------------------------- hooks
# This module is loaded as a plugin with pytest_memeval.plugin (its ``pytest_plugins``).
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memeval_guard(kind): a pytest-memeval byte guard, parametrized over the "
        "[tool.memeval.guards.*] variants that enable it",
    )
    if config.option.collectonly:
        # syrupy 7 judges every snapshot unused when nothing runs: `--collect-only` exits 1,
        # and `--collect-only --snapshot-update` deletes them all. Nothing can be used
        # without running, so there is nothing to judge.
        disable_unused_snapshot_check(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``@pytest.mark.memeval_guard(KIND)`` functions over the guarded variants."""
    marker = metafunc.definition.get_closest_marker("memeval_guard")
    if marker is None or "memeval_guard" not in metafunc.fixturenames:
        return
    kind = marker.args[0] if marker.args else None
    if kind not in GUARD_KINDS:
        pytest.fail(
            f"{metafunc.definition.nodeid}: memeval_guard kind must be one of "
            f"{sorted(GUARD_KINDS)}, got {kind!r}",
            pytrace=False,
        )
    try:
        variants = guard_variants(metafunc.config)
    except GuardError as exc:
        # A collection error: nothing runs, and no snapshot is judged unused or deleted.
        pytest.fail(str(exc), pytrace=False)
    per_scenario, needs = GUARD_KINDS[kind]
    chosen = [v for v in variants if _enabled(kind, v.spec)]
    if not chosen:
        reason = (
            f"no [tool.memeval.guards.*] table enables this guard (it needs {needs}); "
            "see docs/guards.md"
        )
        metafunc.parametrize(
            "memeval_guard",
            [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
            ids=["no-guards"],
        )
        return
    module = os.path.relpath(metafunc.definition.path, metafunc.config.rootpath)
    if per_scenario:
        cases = [GuardCase(v, s, module) for v in chosen for s in v.benchmark.scenarios]
        ids = [f"{v.name}-{s.id}" for v in chosen for s in v.benchmark.scenarios]
    else:
        cases = [GuardCase(v, None, module) for v in chosen]
        ids = [v.name for v in chosen]
    metafunc.parametrize("memeval_guard", cases, ids=ids)


# --------------------------------------------------------------------------- helpers
def _reference(case: GuardCase) -> ReferenceFile:
    try:
        return case.variant.reference()
    except GuardError as exc:
        pytest.fail(str(exc), pytrace=False)


def _tokens(case: GuardCase) -> PromptTokens:
    assert case.scenario is not None
    try:
        return case.variant.tokens(case.scenario)
    except GuardError as exc:
        pytest.fail(str(exc), pytrace=False)


def _check_snapshot(
    case: GuardCase,
    snapshot: SnapshotAssertion,
    extension: type[ByteSnapshot],
    data: bytes,
    what: str,
) -> None:
    # use_extension (not snapshot(extension_class=...)): the latter reverts the extension
    # after the comparison, and the failure would be explained by amber's diff of bytes.
    assertion = snapshot.use_extension(extension)
    if assertion == data:
        return
    diff = assertion.get_assert_diff()
    if any("does not exist!" in line for line in diff):
        lines = [
            f"{case.label}: no snapshot is recorded for {what}; record it (and commit the file):",
        ]
    else:
        lines = [
            f"{case.label}: {what} changed since its snapshot",
            *("  " + line for line in diff),
            "  If the change is intended, record it and commit the changed snapshot files:",
        ]
    lines.append(f"    pytest {case.module} --snapshot-update")
    pytest.fail("\n".join(lines), pytrace=False)


# --------------------------------------------------------------------------- the items
@pytest.mark.memeval_guard("reference_file")
def test_reference_file(memeval_guard: GuardCase) -> None:
    """Reference guard, whole file: the built variant equals its training-format file byte
    for byte (framing, scenario set and order included)."""
    variant = memeval_guard.variant
    built = list(variant.lines.items())
    message = check_reference_file(variant.name, built, _reference(memeval_guard))
    if message:
        pytest.fail(message, pytrace=False)


@pytest.mark.memeval_guard("reference")
def test_reference_bytes(memeval_guard: GuardCase) -> None:
    """Reference guard, per scenario: the built record equals its reference line byte for
    byte; a difference names the message index, the byte offset and both contexts."""
    assert memeval_guard.scenario is not None
    message = check_reference_line(
        memeval_guard.variant.name,
        memeval_guard.scenario.id,
        memeval_guard.built_line,
        _reference(memeval_guard),
    )
    if message:
        pytest.fail(message, pytrace=False)


@pytest.mark.memeval_guard("scenario_order")
def test_scenario_order(memeval_guard: GuardCase, snapshot: SnapshotAssertion) -> None:
    """Snapshot guard: the variant builds the same scenarios in the same order."""
    data = join_lines(memeval_guard.variant.lines)
    _check_snapshot(memeval_guard, snapshot, OrderSnapshot, data, "the scenario order")


@pytest.mark.memeval_guard("record_snapshot")
def test_record_snapshot(memeval_guard: GuardCase, snapshot: SnapshotAssertion) -> None:
    """Snapshot guard: the built record's bytes are unchanged (byte-exact, one file each)."""
    _check_snapshot(
        memeval_guard, snapshot, RecordSnapshot, memeval_guard.built_line, "the built record"
    )


@pytest.mark.memeval_guard("prefix")
def test_prompt_prefix(memeval_guard: GuardCase) -> None:
    """Token guard: each turn's prompt is a token prefix of the next turn's, and of the
    training rendering of the conversation; no doubled BOS, no unknown token."""
    tokens = _tokens(memeval_guard)
    tok = memeval_guard.variant.tokenizer()
    specials = {tok.eos_token_id, tok.bos_token_id, tok.pad_token_id}
    # Some tokenizers reuse one id for unk and eos/bos (GPT-2): then unk is no signal.
    unk = tok.unk_token_id if tok.unk_token_id not in specials else None
    message = check_prefix(
        memeval_guard.variant.name, tokens, unk_token_id=unk, bos_token_id=tok.bos_token_id
    )
    if message:
        pytest.fail(message, pytrace=False)


@pytest.mark.memeval_guard("tokens")
def test_prompt_tokens(memeval_guard: GuardCase, snapshot: SnapshotAssertion) -> None:
    """Token guard: the rendered prompts' token ids are unchanged, so a template or
    tokenizer change fails even when the message text is the same."""
    data = serialize_tokens(_tokens(memeval_guard), memeval_guard.variant.name)
    _check_snapshot(memeval_guard, snapshot, TokenSnapshot, data, "the prompt token ids")
