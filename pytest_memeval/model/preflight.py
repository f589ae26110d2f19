"""Pre-run checks of a model profile's scenarios against its tokenizer and model config.

Run once, on the controller, before any item runs (and before any worker loads weights): it
loads only the tokenizer (local files, ``trust_remote_code`` off) and reads ``config.json``.

* **Chat-template errors.** Templates raise on conversations they do not accept: Gemma's
  rejects a system message, Mistral v1's (and Gemma's) require strict user/assistant
  alternation. Without this check every item of such a scenario would fail with the same
  template traceback, on every worker. Here each scenario is rendered once; any error stops
  the run with one message that names the scenarios and the template's own words.
* **Scenarios longer than the model's context.** The longest sequence a scenario feeds the
  model is the whole conversation (the fast path's teacher-forced pass) or the last prompt
  plus ``max_new_tokens`` (the reference path's last ``generate``). Past the model's
  positions (``max_position_embeddings`` or its spellings in ``config.json``) or the
  tokenizer's ``model_max_length``, a model either fails or, worse, runs on silently with
  extrapolated positions and is scored. Such scenarios are named before the run with their
  lengths and the limit: refused by default, or, with ``--memeval-allow-overlong``
  (ini ``memeval_allow_overlong``), evaluated and flagged (``overlong`` in their record, a
  line in the summary).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.formatting import shown_list
from pytest_memeval.model.prompts import render

__all__ = [
    "ContextLimit",
    "Overlong",
    "OverlongReport",
    "PreflightError",
    "PreflightResult",
    "context_limit",
    "load_tokenizer",
    "preflight",
    "scan_scenarios",
]

#: ``config.json`` keys that hold the number of positions a model was built for, by the
#: spelling of the architectures that use them (GPT-2: ``n_positions``, ...).
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
)
#: transformers' "no limit" value for ``model_max_length`` (``VERY_LARGE_INTEGER``) is 1e30;
#: anything this large is no limit.
_NO_LIMIT = 10**20


class PreflightError(ValueError):
    """The scenarios cannot be evaluated as they are; the message names them and why."""


@dataclass(frozen=True)
class ContextLimit:
    """The most tokens the model can take, and where that number comes from."""

    tokens: int
    source: str  # e.g. "max_position_embeddings in .../config.json"


@dataclass(frozen=True)
class Overlong:
    """A scenario whose longest model input exceeds the context limit."""

    scenario_id: str
    tokens: int


@dataclass
class PreflightResult:
    """What the checks found: the context limit (if any) and the over-long scenarios."""

    limit: ContextLimit | None
    overlong: list[Overlong] = field(default_factory=list)
    #: the longest model input of each scenario checked, in tokens (id -> tokens)
    lengths: dict[str, int] = field(default_factory=dict)

    def overlong_records(self) -> dict[str, dict[str, int]]:
        """``{id: {"tokens": n, "limit": limit}}``: what each over-long record carries."""
        if self.limit is None:
            return {}
        return {
            o.scenario_id: {"tokens": o.tokens, "limit": self.limit.tokens} for o in self.overlong
        }

    def describe_overlong(self) -> str:
        """``'s1' (876 tokens), ...`` for the first few over-long scenarios."""
        return shown_list(f"{o.scenario_id!r} ({o.tokens} tokens)" for o in self.overlong)


def load_tokenizer(directory: Path) -> Any:
    """The tokenizer of a model (or tokenizer) directory, as the worker loads it (no remote
    code, local only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(directory), trust_remote_code=False, local_files_only=True
    )


def _positions(config: Mapping[str, Any]) -> tuple[int, str] | None:
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    text = config.get("text_config")  # multimodal configs nest the language model's
    if isinstance(text, Mapping):
        found = _positions(text)
        if found is not None:
            return found[0], "text_config." + found[1]
    return None


def context_limit(model_dir: Path, tokenizer: Any) -> ContextLimit | None:
    """The smaller of the model's positions (``config.json``) and the tokenizer's
    ``model_max_length``; ``None`` when neither sets a limit."""
    found: list[ContextLimit] = []
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None  # check_model_dir has refused a missing or unreadable config already
    if isinstance(config, Mapping):
        positions = _positions(config)
        if positions is not None:
            found.append(ContextLimit(positions[0], f"{positions[1]} in {config_path}"))
    max_length = getattr(tokenizer, "model_max_length", None)
    if isinstance(max_length, int) and 0 < max_length < _NO_LIMIT:
        found.append(ContextLimit(max_length, f"the tokenizer's model_max_length ({model_dir})"))
    return min(found, key=lambda c: c.tokens) if found else None


def _template_error(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def scan_scenarios(
    tokenizer: Any, scenarios: Sequence[Scenario], max_new_tokens: int
) -> tuple[dict[str, str], dict[str, int]]:
    """Render each scenario once: ``(template errors by id, longest model input by id)``.

    The longest input is the whole conversation (the fast path's one forward pass) or the
    final prompt plus ``max_new_tokens`` (the reference path's last ``generate``).
    """
    # Imported here: jinja2 loads (with transformers' template compiler) only once a model's
    # template is actually rendered, not on every pytest start.
    import jinja2

    errors: dict[str, str] = {}
    lengths: dict[str, int] = {}
    for scenario in scenarios:
        try:
            full = render(tokenizer, scenario.messages, add_generation_prompt=False)
            last = render(
                tokenizer, scenario.messages[: scenario.final_index], add_generation_prompt=True
            )
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            # What a user's chat template can raise (transformers 5.x): TemplateError from
            # its raise_exception(), a syntax error, an undefined name or the sandbox;
            # TypeError from an operation the template applies to the wrong type; ValueError
            # from transformers when the tokenizer has no (or no default) chat template.
            # Anything else (KeyError, AttributeError, AssertionError, ...) is a bug in
            # prompts.render or compat, and propagates as one rather than being reported as
            # the user's template error.
            errors[scenario.id] = _template_error(exc)
            continue
        full_ids, last_ids = (
            tokenizer([full, last], add_special_tokens=False)["input_ids"]
            if getattr(tokenizer, "is_fast", False)
            else [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (full, last)]
        )
        lengths[scenario.id] = max(len(full_ids), len(last_ids) + max_new_tokens)
    return errors, lengths


def _template_message(
    model_dir: Path, scenarios: Sequence[Scenario], errors: Mapping[str, str]
) -> str:
    by_error: dict[str, list[Scenario]] = {}
    source = {s.id: s for s in scenarios}
    for sid, error in errors.items():
        by_error.setdefault(error, []).append(source[sid])
    lines = [
        f"the chat template of {model_dir} rejects {len(errors)} of {len(scenarios)} "
        "scenario(s); nothing was evaluated:"
    ]
    for error, failed in by_error.items():
        named = shown_list(f"{s.id!r} ({s.source})" for s in failed)
        lines.append(f"  {error}")
        lines.append(f"    scenario(s): {named}")
    lines.append(
        "  Reshape those conversations for this template (e.g. fold the system message into "
        "the first user message; alternate user and assistant turns), or use a model whose "
        "template accepts them."
    )
    return "\n".join(lines)


def preflight(
    model_dir: Path,
    scenarios: Sequence[Scenario],
    *,
    max_new_tokens: int,
    allow_overlong: bool,
    tokenizer: Any = None,
    tokenizer_dir: Path | None = None,
    limit: ContextLimit | None = None,
) -> PreflightResult:
    """Check ``scenarios`` against the model's chat template and context length.

    The tokenizer is ``tokenizer`` if given, else loaded from ``tokenizer_dir`` (a profile's
    ``tokenizer`` key) or ``model_dir``; the context is ``limit`` if given (a GGUF file's
    metadata), else read from ``model_dir`` and the tokenizer (:func:`context_limit`).
    Raises :class:`PreflightError` (one message) on template errors, and on over-long
    scenarios unless ``allow_overlong``; otherwise returns what it found.
    """
    tok = tokenizer
    if tok is None:
        try:
            tok = load_tokenizer(tokenizer_dir or model_dir)
        except (OSError, ValueError, KeyError):
            # Not this check's to report: the worker's checkpoint load fails on the same
            # directory with its own message (model.load_model).
            return PreflightResult(None)
    if getattr(tok, "chat_template", None) is None:
        return PreflightResult(None)  # the worker's load_model says so, with its own message
    errors, lengths = scan_scenarios(tok, scenarios, max_new_tokens)
    if errors:
        raise PreflightError(_template_message(tokenizer_dir or model_dir, scenarios, errors))
    limit = limit or context_limit(model_dir, tok)
    result = PreflightResult(limit, lengths=lengths)
    if limit is not None:
        result.overlong = [
            Overlong(s.id, lengths[s.id]) for s in scenarios if lengths[s.id] > limit.tokens
        ]
    if limit is not None and result.overlong and not allow_overlong:
        raise PreflightError(
            f"{len(result.overlong)} of {len(scenarios)} scenario(s) are longer than the "
            f"model's context of {limit.tokens} tokens ({limit.source}): "
            f"{result.describe_overlong()}. Lengths count the whole conversation, or the "
            f"final prompt plus max_new_tokens ({max_new_tokens}), whichever is longer. "
            "Shorten or drop them, or pass --memeval-allow-overlong (ini "
            "memeval_allow_overlong = true) to evaluate them anyway, flagged as over-long in "
            "their records and the summary."
        )
    return result


class OverlongReport:
    """Registered on the controller when over-long scenarios are evaluated on request: names
    them in the header and the summary, and hands their ids to the xdist workers (whose
    records then carry ``overlong``)."""

    def __init__(self, result: PreflightResult) -> None:
        self.result = result

    def _line(self) -> str:
        limit = self.result.limit
        assert limit is not None
        return (
            f"{len(self.result.overlong)} scenario(s) longer than the model's context of "
            f"{limit.tokens} tokens ({limit.source}), evaluated on request "
            f"(--memeval-allow-overlong): {self.result.describe_overlong()}"
        )

    def pytest_report_header(self) -> str:
        return "memeval: WARNING: " + self._line()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # Plain data only.
        node.workerinput["memeval_overlong"] = self.result.overlong_records()

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.line(
            "over-long: " + self._line() + "; their records say overlong", yellow=True
        )
