"""``memeval init``: from a model and a benchmark to a working profile in one step.

::

    memeval init --name mine --model DIR|FILE.gguf [--adapter DIR] --benchmark FILE
                 [--project DIR] [--max-new-tokens N] [--allow-overlong]

checks what can be checked without loading weights, then appends the profile table
``[tool.memeval.ckpt.<name>]`` to the project's ``pyproject.toml`` (created if missing; the
user's own text is kept byte for byte) and prints the command that runs it. The checks are
the run's own (the same functions ``pytest --ckpt`` calls at configure):

* the model: a transformers directory with ``config.json`` and safetensors weights only
  (pickle files are refused, never unpickled), no remote code (``model/checks.py``); or a
  ``.gguf`` file whose metadata gives the tokenizer and the context (``model/gguf.py``);
* the adapter: a PEFT directory with safetensors weights that fits the base model's tensor
  shapes, read from the safetensors headers (``check_adapter_fits``; a GGUF base is checked
  at the first run, after its conversion);
* the tokenizer (no weights) and its chat template;
* every scenario of the benchmark parses (file, line and field named otherwise) and renders
  through the chat template, and its longest input fits the model's context with
  ``max_new_tokens`` (``model/preflight.py``).

Bad input is one message naming what is wrong and exit status 2; nothing is written then.
An existing profile of that name is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_memeval.core.benchmark import Benchmark, BenchmarkError, load_jsonl
from pytest_memeval.core.profiles import (
    ProfileError,
    load_profiles,
    parse_toml,
    resolve_profile,
)
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.model.checks import (
    PICKLE_SUFFIXES,
    CheckpointError,
    check_adapter_dir,
    check_adapter_fits,
    check_model_dir,
)
from pytest_memeval.model.gguf import is_gguf, read_gguf_header
from pytest_memeval.model.preflight import (
    ContextLimit,
    PreflightError,
    PreflightResult,
    context_limit,
    load_tokenizer,
    preflight,
)

__all__ = ["InitError", "cli_arguments", "cli_main", "profile_block"]

#: The exit status of bad input (argparse's own for a bad command line).
BAD_INPUT = 2
#: Profile names written as bare TOML keys (a dot would nest tables).
_NAME = re.compile(r"[A-Za-z0-9_-]+")
DEFAULT_MAX_NEW_TOKENS = 32


class InitError(ValueError):
    """Bad input to ``memeval init``; the message names what is wrong."""


@dataclass(frozen=True)
class Checked:
    """What the checks found, for the summary."""

    model: str  # "safetensors directory, 1 weight file" or "GGUF file"
    adapter: str | None
    scenarios: int
    longest: int  # tokens of the longest model input
    limit: ContextLimit | None
    overlong: int


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``init`` subcommand's arguments to ``parser``."""
    parser.add_argument(
        "--name",
        required=True,
        metavar="NAME",
        help="profile name: pytest --ckpt NAME ([tool.memeval.ckpt.NAME])",
    )
    parser.add_argument(
        "--model",
        required=True,
        type=Path,
        metavar="DIR|FILE.gguf",
        help="base model: a transformers directory (safetensors) or a .gguf file",
    )
    parser.add_argument(
        "--adapter", type=Path, default=None, metavar="DIR", help="PEFT adapter directory"
    )
    parser.add_argument(
        "--benchmark", required=True, type=Path, metavar="FILE", help="benchmark JSONL file"
    )
    parser.add_argument(
        "--project",
        type=Path,
        metavar="DIR",
        default=Path(),
        help="project directory whose pyproject.toml gets the profile (default: here)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        default=None,
        help=f"generation.max_new_tokens of the profile (default {DEFAULT_MAX_NEW_TOKENS}, "
        "left out of the profile)",
    )
    parser.add_argument(
        "--allow-overlong",
        action="store_true",
        help="write the profile although scenarios exceed the model's context (they are then "
        "evaluated with pytest --memeval-allow-overlong, flagged)",
    )


def cli_main(args: argparse.Namespace) -> int:
    """Check, write the profile and print how to run it (0); bad input: one message (2)."""
    try:
        project, pyproject, text = _project(args.project, args.name)
        checked = check_inputs(
            args.model,
            args.adapter,
            args.benchmark,
            max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            allow_overlong=args.allow_overlong,
        )
        block = profile_block(
            args.name,
            project,
            model=args.model,
            adapter=args.adapter,
            benchmark=args.benchmark,
            max_new_tokens=args.max_new_tokens,
        )
        _write(pyproject, text, block, args.name)
    except (InitError, CheckpointError, BenchmarkError, PreflightError, ProfileError) as exc:
        print(f"memeval init: {exc}", file=sys.stderr)
        return BAD_INPUT
    _summary(args, project, pyproject, block, checked)
    return 0


def _project(directory: Path, name: str) -> tuple[Path, Path, str]:
    """The project directory, its ``pyproject.toml`` and that file's text ("" if absent);
    refuses a bad name and an existing profile of that name."""
    if not _NAME.fullmatch(name):
        raise InitError(
            f"--name {name!r}: a profile name is letters, digits, '_' and '-' (pytest --ckpt NAME)"
        )
    project = directory.expanduser().resolve()
    if not project.is_dir():
        raise InitError(f"--project {directory}: not a directory")
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    if name in load_profiles(pyproject):
        raise InitError(
            f"{pyproject}: a profile [tool.memeval.ckpt.{name}] exists already; it was left "
            "as it is (choose another --name, or edit or remove that table)"
        )
    return project, pyproject, text


def check_inputs(
    model: Path,
    adapter: Path | None,
    benchmark: Path,
    *,
    max_new_tokens: int,
    allow_overlong: bool,
) -> Checked:
    """Every check that needs no weights; raises with one message on the first problem."""
    if max_new_tokens < 1:
        raise InitError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    model = model.expanduser().resolve()
    gguf_limit: ContextLimit | None = None
    if is_gguf(model):
        header = read_gguf_header(model)
        tokenizer = header.tokenizer
        if header.positions is not None:
            gguf_limit = ContextLimit(header.positions, f"the metadata of {model}")
        described = f"GGUF file ({model.stat().st_size / 2**20:.1f} MiB)"
    else:
        if model.is_file():
            kind = "pickle" if model.suffix.lower() in PICKLE_SUFFIXES else "file"
            raise InitError(
                f"--model {model}: a {kind} file; give a transformers model directory "
                "(safetensors weights) or a .gguf file (pickle checkpoints are refused and "
                "never unpickled)"
            )
        check_model_dir(model)
        tokenizer = _tokenizer(model)
        weights = sorted(p.name for p in model.glob("*.safetensors"))
        described = f"safetensors directory ({len(weights)} weight file(s))"
    adapter_text = None
    if adapter is not None:
        adapter = adapter.expanduser().resolve()
        check_adapter_dir(adapter)
        if is_gguf(model):
            adapter_text = "PEFT, safetensors (its fit to the base is checked at the first run)"
        else:
            check_adapter_fits(model, adapter)
            adapter_text = f"PEFT, safetensors, fits the base ({_adapter_kind(adapter)})"
    if getattr(tokenizer, "chat_template", None) is None:
        raise InitError(
            f"--model {model}: the tokenizer has no chat template (tokenizer_config.json's "
            "chat_template or chat_template.jinja); the scenarios are rendered through it"
        )
    scenarios = _benchmark(benchmark)
    result: PreflightResult = preflight(
        model if model.is_dir() else model.parent,
        scenarios.scenarios,
        max_new_tokens=max_new_tokens,
        allow_overlong=allow_overlong,
        tokenizer=tokenizer,
        limit=gguf_limit or (context_limit(model, tokenizer) if model.is_dir() else None),
    )
    longest = max(result.lengths.values(), default=0)
    return Checked(
        model=described,
        adapter=adapter_text,
        scenarios=len(scenarios.scenarios),
        longest=longest,
        limit=result.limit,
        overlong=len(result.overlong),
    )


def _tokenizer(model: Path) -> Any:
    try:
        return load_tokenizer(model)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InitError(f"--model {model}: its tokenizer cannot be loaded ({first})") from None


def _adapter_kind(adapter: Path) -> str:
    try:
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "adapter_config.json unreadable"
    if not isinstance(config, dict):
        return "adapter"
    return f"{config.get('peft_type', 'PEFT')} r={config.get('r', '?')}"


def _benchmark(path: Path) -> Benchmark:
    path = path.expanduser().resolve()
    if path.is_dir():
        raise InitError(f"--benchmark {path}: a directory; give the benchmark's JSONL file")
    benchmark = load_jsonl(path)
    if not benchmark.scenarios:
        raise InitError(f"--benchmark {path}: no scenario (the file has no record)")
    return benchmark


def _toml_path(path: Path, project: Path) -> str:
    """``path`` as the profile stores it: relative to the project when inside it (POSIX
    separators), else absolute; a TOML basic string."""
    resolved = path.expanduser().resolve()
    shown = (
        resolved.relative_to(project).as_posix()
        if resolved.is_relative_to(project)
        else resolved.as_posix()
    )
    return json.dumps(shown, ensure_ascii=False)  # a JSON string is a TOML basic string


def profile_block(
    name: str,
    project: Path,
    *,
    model: Path,
    adapter: Path | None,
    benchmark: Path,
    max_new_tokens: int | None = None,
) -> str:
    """The profile table's text, as appended to ``pyproject.toml``."""
    lines = [
        f"[tool.memeval.ckpt.{name}]",
        f"model = {_toml_path(model, project)}",
    ]
    if adapter is not None:
        lines.append(f"adapter = {_toml_path(adapter, project)}")
    lines.append(f"benchmark = {_toml_path(benchmark, project)}")
    if max_new_tokens is not None:
        lines.append(f"generation = {{ max_new_tokens = {max_new_tokens} }}")
    return "\n".join(lines) + "\n"


def _write(pyproject: Path, text: str, block: str, name: str) -> None:
    """Append ``block`` to the file's text (its own bytes unchanged), after checking that
    the result is valid TOML and resolves to the profile; written atomically."""
    if text and not text.endswith("\n"):
        text += "\n"
    new = text + ("\n" if text else "") + block
    try:
        parse_toml(new, pyproject)
    except ProfileError as exc:
        raise InitError(
            f"{exc}, once the profile is appended (a [tool.memeval.ckpt] written as an inline "
            f"table?); add this table yourself:\n{block}"
        ) from None
    atomic_write(pyproject, [new])
    resolve_profile(name, pyproject)  # reads back what pytest --ckpt will read


def _summary(
    args: argparse.Namespace, project: Path, pyproject: Path, block: str, checked: Checked
) -> None:
    limit = checked.limit
    context = (
        f"the model's context of {limit.tokens} tokens ({limit.source})"
        if limit is not None
        else "no context limit found (config.json and tokenizer set none)"
    )
    lines = [
        f"memeval init: profile {args.name!r} written to {pyproject}:",
        "",
        *("    " + line for line in block.splitlines()),
        "",
        "checked (no weights loaded):",
        f"  model:     {checked.model}, no remote code, chat template present",
        f"  adapter:   {checked.adapter or 'none'}",
        f"  benchmark: {checked.scenarios} scenario(s) parse and render through the chat template",
        f"  lengths:   longest input {checked.longest} tokens, against {context}",
    ]
    run = f"pytest --ckpt {args.name}"
    if checked.overlong:
        lines.append(f"  over-long: {checked.overlong} scenario(s), evaluated flagged")
        run += " --memeval-allow-overlong"
    here = Path.cwd().resolve()
    where = "" if here == project else f"cd {_shell_path(project)} && "
    lines += [
        "",
        f"run it:  {where}{run}",
        f"         {where}{run} -n 2    (two xdist workers, one per GPU where there are GPUs)",
    ]
    print("\n".join(lines))


def _shell_path(path: Path) -> str:
    text = str(path)
    return text if re.fullmatch(r"[\w@%+=:,./-]+", text) else "'" + text.replace("'", "'\\''") + "'"
