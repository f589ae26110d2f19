"""Byte guards: model-free proof that evaluation prompts equal training prompts.

Three contracts, each pure functions in a module of its own (the pytest surface is
:mod:`pytest_memeval.guard_tests`); this module gathers their public names:

* **reference** (:mod:`.reference`) — the records the harness builds for a data variant,
  serialised with :func:`~pytest_memeval.core.benchmark.dump_record`, equal that variant's
  training-format file byte for byte. A difference names the scenario, the message index,
  the first differing byte offset and a short context on both sides (:mod:`.differences`;
  for the scenario order snapshot, :mod:`.order`).
* **tokens** (:mod:`.tokens`) — the rendered prompts (after the tokenizer's chat template) as
  token ids, in a compact text form (:func:`serialize_tokens`) that a byte-exact snapshot
  keeps, so a template or tokenizer change fails even when the message text is unchanged.
* **prefix** (:mod:`.prefix`) — the prompt of each assistant turn is a token prefix of the
  next turn's prompt and of the training rendering of the whole conversation (what the model
  was trained on).

Guarded variants are configured in ``[tool.memeval.guards.NAME]`` tables next to the
checkpoint profiles (:mod:`.specs`, :func:`load_guard_specs`); no checkpoint is loaded, only
the tokenizer. Nothing here imports torch or transformers at module level.
"""

from __future__ import annotations

from pytest_memeval.guards.differences import (
    CONTEXT,
    describe_byte_difference,
    describe_record_difference,
    first_difference,
)
from pytest_memeval.guards.order import describe_order_difference, join_lines
from pytest_memeval.guards.prefix import check_prefix
from pytest_memeval.guards.reference import (
    ReferenceFile,
    ReferenceLine,
    check_reference_file,
    check_reference_line,
    read_reference,
)
from pytest_memeval.guards.specs import SNAPSHOT_KINDS, GuardError, GuardSpec, load_guard_specs
from pytest_memeval.guards.tokens import (
    ParsedTokens,
    PromptTokens,
    describe_token_difference,
    parse_tokens,
    prompt_tokens,
    serialize_tokens,
)

__all__ = [
    "CONTEXT",
    "SNAPSHOT_KINDS",
    "GuardError",
    "GuardSpec",
    "ParsedTokens",
    "PromptTokens",
    "ReferenceFile",
    "ReferenceLine",
    "check_prefix",
    "check_reference_file",
    "check_reference_line",
    "describe_byte_difference",
    "describe_order_difference",
    "describe_record_difference",
    "describe_token_difference",
    "first_difference",
    "join_lines",
    "load_guard_specs",
    "parse_tokens",
    "prompt_tokens",
    "read_reference",
    "serialize_tokens",
]
