"""``memeval init``: a model and a benchmark to a working profile, checked without weights.

The checks are real: the bundled demo checkpoint (base + oracle adapter) and a tiny GGUF
file written here; the written profile is then run with ``pytest --ckpt mine`` in that
project, outside this repository. Bad input (an existing profile, a missing adapter, a
malformed benchmark line, a pickle checkpoint, over-long scenarios) is one message naming
what is wrong, exit status 2, and nothing written.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_memeval.core.profiles import resolve_profile
from pytest_memeval.tools.cli import main

from .. import forkserver
from ..conftest import ADAPTERS, BASE_MODEL, DEMO, INNER_ADDOPTS, demo_records, write_jsonl
from ..ggufs import write_tiny_gguf

N = 3  # scenarios of the benchmark the profile runs


def _init(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["init", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project outside the repository, with a 3-scenario ``data/bench.jsonl``."""
    root = tmp_path / "my project"
    (root / "data").mkdir(parents=True)
    write_jsonl(root / "data" / "bench.jsonl", demo_records("oracle", N))
    return root


def _demo_args(project: Path, *extra: str) -> list[str]:
    return [
        "--name",
        "mine",
        "--model",
        str(BASE_MODEL),
        "--adapter",
        str(ADAPTERS / "oracle"),
        "--benchmark",
        str(project / "data" / "bench.jsonl"),
        "--project",
        str(project),
        *extra,
    ]


@pytest.mark.slow
def test_init_writes_a_profile_that_pytest_runs(project: Path) -> None:
    user_text = '[project]\nname = "mine"\n\n[tool.ruff]\nline-length = 99'  # no final newline
    (project / "pyproject.toml").write_text(user_text, "utf-8")
    code, out, err = _init(*_demo_args(project, "--max-new-tokens", "16"))
    assert code == 0, err
    text = (project / "pyproject.toml").read_text("utf-8")
    assert text.startswith(user_text + "\n")  # the user's own text, byte for byte
    assert text[len(user_text) :] == (
        "\n\n[tool.memeval.ckpt.mine]\n"
        f"model = {json.dumps(BASE_MODEL.as_posix())}\n"
        f"adapter = {json.dumps((ADAPTERS / 'oracle').as_posix())}\n"
        'benchmark = "data/bench.jsonl"\n'  # inside the project: relative to it
        "generation = { max_new_tokens = 16 }\n"
    )
    profile = resolve_profile("mine", project / "pyproject.toml")
    assert profile.model == BASE_MODEL and profile.adapter == ADAPTERS / "oracle"
    assert profile.benchmark.path == project / "data" / "bench.jsonl"
    assert profile.generation.max_new_tokens == 16
    assert f"{N} scenario(s) parse and render through the chat template" in out
    assert "fits the base (LORA r=" in out
    assert "of 2048 tokens (max_position_embeddings in" in out
    assert "cd 'my project'" not in out and f"cd '{project}' && pytest --ckpt mine" in out
    assert "pytest --ckpt mine -n 2" in out

    # The command it printed, in that project: every scenario evaluated and written.
    python = forkserver.interpreter()
    proc = subprocess.run(
        [python.executable, "-m", "pytest", "--ckpt", "mine", *INNER_ADDOPTS.split()],
        cwd=project,
        env=python.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr
    metrics = json.loads((project / "runs" / "mine" / "metrics.json").read_text("utf-8"))
    assert metrics["scope"]["evaluated"] == N and metrics["complete"] is True


@pytest.mark.slow
def test_an_existing_profile_is_never_overwritten(project: Path) -> None:
    code, _, err = _init(*_demo_args(project))
    assert code == 0, err
    before = (project / "pyproject.toml").read_bytes()
    code, out, err = _init(*_demo_args(project, "--max-new-tokens", "8"))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"memeval init: {project / 'pyproject.toml'}: a profile [tool.memeval.ckpt.mine] "
        "exists already; it was left as it is (choose another --name, or edit or remove "
        "that table)"
    ]
    assert (project / "pyproject.toml").read_bytes() == before


@pytest.mark.slow
def test_bad_input_is_one_message_and_writes_nothing(project: Path, tmp_path: Path) -> None:
    bench = project / "data" / "bench.jsonl"

    def refused(args: list[str], message: str) -> None:
        code, out, err = _init(*args)
        assert code == 2, (args, out, err)
        assert message in err, err
        assert err.startswith("memeval init: ") and out == ""
        assert not (project / "pyproject.toml").exists()

    missing = tmp_path / "no-such-adapter"
    args = _demo_args(project)
    refused(
        [*args[:5], str(missing), *args[6:]],
        f"memeval init: adapter directory not found: {missing}",
    )

    broken = project / "data" / "broken.jsonl"
    lines = bench.read_text("utf-8").splitlines()
    broken.write_text(lines[0] + "\n" + lines[1][:40] + "\n" + lines[2] + "\n", "utf-8")
    refused([*args[:7], str(broken), *args[8:]], f"{broken}:2: malformed JSON")

    no_field = project / "data" / "no_field.jsonl"
    record = json.loads(lines[1])
    del record["messages"]
    no_field.write_text(lines[0] + "\n" + json.dumps(record) + "\n", "utf-8")
    refused(
        [*args[:7], str(no_field), *args[8:]],
        f"{no_field}:2 (scenario {record['id']!r}): field 'messages' is missing",
    )

    # A pickle checkpoint: refused, never unpickled (the file is not even a valid pickle).
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(BASE_MODEL / name, pickled / name)
    (pickled / "pytorch_model.bin").write_bytes(b"not unpickled")
    refused(
        [*args[:3], str(pickled), *args[4:]],
        f"{pickled}: no .safetensors weights (found: pytorch_model.bin); pickle checkpoints "
        "are refused and never unpickled",
    )
    refused(
        [*args[:3], str(pickled / "pytorch_model.bin"), *args[4:]],
        "a pickle file; give a transformers model directory",
    )

    # Longer than the model's context with max_new_tokens: named, unless allowed.
    refused(
        [*args, "--max-new-tokens", "4000"],
        f"{N} of {N} scenario(s) are longer than the model's context of 2048 tokens",
    )
    refused([*args[:1], "my.name", *args[2:]], "--name 'my.name': a profile name is")
    code, out, err = _init(*args, "--max-new-tokens", "4000", "--allow-overlong")
    assert code == 0, err
    assert f"over-long: {N} scenario(s)" in out
    assert "pytest --ckpt mine --memeval-allow-overlong" in out


@pytest.mark.slow
def test_a_gguf_model_is_checked_from_its_metadata(project: Path, tmp_path: Path) -> None:
    gguf_file = project / "models" / "tiny.gguf"
    gguf_file.parent.mkdir()
    write_tiny_gguf(gguf_file)
    bench = project / "data" / "bench.jsonl"
    code, out, err = _init(
        "--name", "tiny", "--model", str(gguf_file), "--benchmark", str(bench),
        "--project", str(project),
    )  # fmt: skip
    assert code == 0, err
    text = (project / "pyproject.toml").read_text("utf-8")
    assert text == (
        '[tool.memeval.ckpt.tiny]\nmodel = "models/tiny.gguf"\nbenchmark = "data/bench.jsonl"\n'
    )
    assert "GGUF file (" in out and f"the metadata of {gguf_file}" in out

    not_gguf = tmp_path / "fake.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    code, out, err = _init(
        "--name", "fake", "--model", str(not_gguf), "--benchmark", str(bench),
        "--project", str(project),
    )  # fmt: skip
    assert code == 2
    assert (
        err.strip() == f"memeval init: {not_gguf}: not a GGUF file (it does not start with 'GGUF')"
    )
    assert (project / "pyproject.toml").read_text("utf-8") == text


def test_demo_assets_exist() -> None:
    """The demo checkpoint these tests point at is part of the repository."""
    assert (DEMO / "checkpoint" / "base" / "model.safetensors").is_file()
