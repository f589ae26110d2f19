"""GGUF checkpoints, on a small file the tests write themselves (tests/ggufs.py: the tiny
Llama checkpoint as llama.cpp would convert it, Q8_0), so no download is needed.

The real SmolLM2 file is tested in test_real_model.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.rundir import sha256_file
from pytest_memeval.model.checks import CheckpointError, check_model_dir, fingerprint_dir
from pytest_memeval.model.gguf import PROVENANCE, convert_gguf
from pytest_memeval.tools.cli import main

from .. import forkserver
from ..conftest import EVAL_MODULE, INNER_ADDOPTS, MemevalProject, write_jsonl
from ..families import FAMILIES, family_records
from ..ggufs import TINY_LLAMA, write_tiny_gguf
from ..plainloop import plain_loop, predicted, record_outputs

MAX_NEW = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny GGUF file (a path with a space) and the weights it must give back.

    Also imports the model stack now, before any test's pytester takes its sys.modules
    snapshot (modules first imported inside such a test are dropped at its end, and torch
    and numpy cannot be imported twice in one process)."""
    import peft  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    path = tmp_path_factory.mktemp("gguf") / "tiny llama.Q8_0.gguf"
    return path, write_tiny_gguf(path)


def test_conversion_is_exact_once_and_keyed_by_content(
    tiny: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    import numpy as np
    from safetensors.numpy import load_file

    path, expected = tiny
    cache = tmp_path / "cache"
    lines: list[str] = []
    first = convert_gguf(path, cache, lines.append)
    assert first.seconds is not None and len(lines) == 1 and "converting" in lines[0]
    assert first.fingerprint == sha256_file(path)  # what `sha256sum FILE` prints
    assert first.directory == cache / "gguf" / first.fingerprint.split(":")[1]
    check_model_dir(first.directory)
    got = load_file(str(first.directory / "model.safetensors"))
    assert set(got) == set(expected)
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    names = {p.name for p in first.directory.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", PROVENANCE} <= names
    config = json.loads((first.directory / "config.json").read_text("utf-8"))
    assert "quantization_config" not in config and config["num_key_value_heads"] == 2
    generation = json.loads((first.directory / "generation_config.json").read_text("utf-8"))
    assert generation["eos_token_id"] == 4  # <|eot_id|>, the file's eos
    # Again, and under another name elsewhere: the same conversion, not made again.
    other = tmp_path / "elsewhere" / "renamed.gguf"
    other.parent.mkdir()
    other.write_bytes(path.read_bytes())
    for again in (convert_gguf(path, cache, lines.append), convert_gguf(other, cache)):
        assert again.seconds is None and again.directory == first.directory
    assert len(lines) == 1
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == sorted(
        [first.directory.name, first.directory.name + ".lock"]
    )


def test_without_the_gguf_package_one_error_names_the_extra(
    tiny: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets uninstalled
    with pytest.raises(CheckpointError) as err:
        convert_gguf(tiny[0], tmp_path)
    assert "needs the 'gguf' package" in str(err.value)
    assert "pip install 'pytest-memeval[gguf]'" in str(err.value)
    assert not (tmp_path / "gguf" / sha256_file(tiny[0]).split(":")[1]).exists()


def test_files_that_cannot_be_converted_are_one_error_each(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"GGUF file not found: .*missing\.gguf"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(CheckpointError, match=r"broken.gguf: transformers .* cannot load"):
        convert_gguf(broken, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()] == []
    with pytest.raises(CheckpointError, match="is a GGUF file, not a model directory"):
        check_model_dir(broken)


# --------------------------------------------------------------------------- plugin runs
def _project(project: MemevalProject, tiny: Path, *, extra: str = "") -> list[dict[str, Any]]:
    """A project outside the repo: the GGUF file at ``models/tiny model.gguf``, its own cache
    (``memeval_cache_dir = ".cache"``, relative to the rootdir), profile ``tiny``."""
    root = project.path
    (root / "models").mkdir(exist_ok=True)
    if not (root / "models" / "tiny model.gguf").exists():
        os.link(tiny, root / "models" / "tiny model.gguf")
    records = family_records(FAMILIES["llama3"], "baseline", "val", 3)
    write_jsonl(root / "bench.jsonl", records)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.pytest.ini_options]
            addopts = "{INNER_ADDOPTS}"
            memeval_cache_dir = ".cache"

            [tool.memeval.ckpt.tiny]
            model = "models/tiny model.gguf"
            benchmark = "bench.jsonl"
            generation = {{ max_new_tokens = {MAX_NEW} }}
            {extra}
            """
        ),
        "utf-8",
    )
    (root / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    return records


@pytest.mark.slow  # a pytest run (the fork server's first, on its worker)
def test_missing_gguf_package_stops_the_run_with_one_usage_error(
    tiny: tuple[Path, dict[str, Any]], memeval_project: MemevalProject
) -> None:
    _project(memeval_project, tiny[0])
    (memeval_project.path / "conftest.py").write_text(
        "import sys\nsys.modules['gguf'] = None  # as if it were not installed\n", "utf-8"
    )
    run = memeval_project.run("--ckpt", "tiny")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    err = run.stderr.str()
    assert err.count("pip install 'pytest-memeval[gguf]'") == 1, err
    assert "tiny model.gguf" in err and "Traceback" not in err
    assert not (memeval_project.path / "runs").exists()


@pytest.mark.slow
def test_plugin_runs_on_a_gguf_file_predict_what_the_plain_loop_predicts(
    tiny: tuple[Path, dict[str, Any]], memeval_project: MemevalProject
) -> None:
    """Relative in the profile (a name with a space), absolute with ``--memeval-model PATH``,
    relative with ``--memeval-model=PATH``; ``-n 0`` and ``-n 2``: one conversion, the same
    records, the plain loop's predictions on the model transformers loads from the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    records = _project(memeval_project, tiny[0])
    where = {"gguf_file": tiny[0].name}
    model = AutoModelForCausalLM.from_pretrained(
        str(tiny[0].parent), dtype=torch.float32, attn_implementation="eager", **where
    ).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny[0].parent), **where)
    expected = {r["id"]: plain_loop(model, tok, r["messages"], MAX_NEW) for r in records}
    assert any(stop for turns in expected.values() for _, stop in turns)

    root = memeval_project.path
    first = memeval_project.run("-n", "2", "--ckpt", "tiny")
    assert first.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), first.stdout.str()
    # Converted once, by the controller, before the workers started.
    assert first.stderr.str().count("memeval: converting") == 1, first.stderr.str()
    assert "converted to safetensors in" in first.stdout.str()
    absolute = memeval_project.run(
        "-n", "0", "--ckpt", "tiny", "--memeval-model", str(root / "models" / "tiny model.gguf")
    )
    # Both overrides name the same path, so the -n 2 run below replaces this run's directory:
    # read its records now, to compare the -n 0 run's predictions too.
    (overridden,) = (p for p in (root / "runs").iterdir() if p.name.startswith("tiny@model"))
    serial_text = (overridden / "predictions.jsonl").read_text("utf-8")
    serial = [json.loads(line) for line in serial_text.splitlines()]
    relative = memeval_project.run(
        "-n", "2", "--ckpt", "tiny", "--memeval-model=models/tiny model.gguf"
    )
    for run in (absolute, relative):
        assert run.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), run.stdout.str()
        assert "memeval: converting" not in run.stderr.str()
        assert "safetensors conversion from the cache" in run.stdout.str()
    runs = sorted(p for p in (root / "runs").iterdir() if p.is_dir())
    assert len(runs) == 2  # tiny, and tiny@model-... (both overrides name the same path)
    seen = []
    for run_dir in runs:
        lines = (run_dir / "predictions.jsonl").read_text("utf-8").splitlines()
        got = [json.loads(line) for line in lines]
        assert {r["id"]: record_outputs(r) for r in got} == expected
        metrics = json.loads((run_dir / "metrics.json").read_text("utf-8"))
        assert metrics["fingerprints"]["model"] == sha256_file(tiny[0])
        seen.append([predicted(r) for r in got])
    assert seen[0] == seen[1] == [predicted(r) for r in serial]
    assert {r["id"]: record_outputs(r) for r in serial} == expected
    assert len([p for p in (root / ".cache" / "gguf").iterdir() if p.is_dir()]) == 1


@pytest.mark.slow
def test_a_tokenizer_directory_replaces_the_files_own(
    tiny: tuple[Path, dict[str, Any]], memeval_project: MemevalProject
) -> None:
    """``tokenizer = DIR``: prompts from that tokenizer (here the checkpoint the file was
    made from: the same token ids), fingerprinted as ``tokenizer``."""
    _project(memeval_project, tiny[0], extra=f'tokenizer = "{TINY_LLAMA.as_posix()}"')
    run = memeval_project.run("--ckpt", "tiny")
    assert run.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), run.stdout.str()
    assert f"tokenizer {TINY_LLAMA}" in run.stdout.str()
    metrics = memeval_project.metrics("tiny")
    assert metrics["fingerprints"]["tokenizer"] == fingerprint_dir(TINY_LLAMA)
    _project(memeval_project, tiny[0], extra='tokenizer = "no/such/dir"')
    bad = memeval_project.run("--ckpt", "tiny")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "tokenizer directory not found:" in bad.stderr.str()


@pytest.mark.slow
def test_two_runs_racing_for_one_file_convert_it_once(
    tiny: tuple[Path, dict[str, Any]], memeval_project: MemevalProject
) -> None:
    _project(memeval_project, tiny[0])
    root = memeval_project.path
    python = forkserver.interpreter({**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    procs = [
        subprocess.Popen(
            [python.executable, "-m", "pytest", "--ckpt", "tiny", f"--memeval-out=runs/{name}"],
            cwd=root,
            env=python.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [p.communicate(timeout=600) for p in procs]
    for proc, (out, _) in zip(procs, outputs, strict=True):
        assert proc.returncode in (0, 1), out
    stderr = "".join(err for _, err in outputs)
    assert stderr.count("memeval: converting") == 1, stderr
    assert len([p for p in (root / ".cache" / "gguf").iterdir() if p.is_dir()]) == 1
    a, b = ((root / "runs" / n / "predictions.jsonl").read_text("utf-8") for n in "ab")
    assert [predicted(json.loads(x)) for x in a.splitlines()] == [
        predicted(json.loads(x)) for x in b.splitlines()
    ]


@pytest.mark.slow
def test_bench_on_a_gguf_profile_converts_it_once_and_prints_the_floor(
    tiny: tuple[Path, dict[str, Any]],
    memeval_project: MemevalProject,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _project(memeval_project, tiny[0])
    root = memeval_project.path
    args = ["bench", "--profiles", str(root / "pyproject.toml"), "--profile", "tiny"]
    args += ["--turns", "", "--threads", "1", "--cache-dir", str(root / "bench cache")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("memeval: converting") == 1 and "tiny model.gguf" in out
    floor = (
        r"^floor: +[\d.]+ s .*; fast path [\d.]+x the floor( \([\d.]+x without the calibration\))?$"
    )
    assert re.search(floor, out, re.M), out
    assert re.search(
        r"^calibration: measured now, .* stored in .*bench cache/calibration/", out, re.M
    )
    assert out.strip().endswith("predictions identical: yes")
    assert main(args) == 0  # the conversion is there now, and the calibration
    again = capsys.readouterr().out
    assert "memeval: converting" not in again
    assert re.search(r"^calibration: reused \(measured ", again, re.M), again


@pytest.mark.slow
def test_token_guards_of_a_gguf_profile_use_the_files_tokenizer(
    tiny: tuple[Path, dict[str, Any]], memeval_project: MemevalProject
) -> None:
    """A plain ``pytest`` (no ``--ckpt``) guarding a GGUF profile's prompt tokens renders
    them with the file's own tokenizer, from its conversion (made once)."""
    from transformers import AutoTokenizer

    records = _project(memeval_project, tiny[0])
    root = memeval_project.path
    with (root / "pyproject.toml").open("a", encoding="utf-8") as fh:
        fh.write('\n[tool.memeval.guards.tiny]\nsnapshot = ["tokens"]\n')
    (root / "test_tiny_guards.py").write_text(
        "from pytest_memeval.guard_tests import test_prompt_prefix, test_prompt_tokens"
        "  # noqa: F401\n",
        "utf-8",
    )
    first = memeval_project.run("test_tiny_guards.py", "--snapshot-update")
    assert first.ret == pytest.ExitCode.OK, first.stdout.str() + first.stderr.str()
    again = memeval_project.run("test_tiny_guards.py")
    again.assert_outcomes(passed=2 * len(records))  # tokens and prefix, per scenario
    conversion = next(p for p in (root / ".cache" / "gguf").iterdir() if p.is_dir())
    ids = AutoTokenizer.from_pretrained(str(conversion)).apply_chat_template(
        records[0]["messages"]
    )["input_ids"]
    snapshot = next((root / "__snapshots__").rglob(f"*tiny-{records[0]['id']}*.tokens"))
    assert f"conversation {len(ids)}: {' '.join(map(str, ids))}\n" in snapshot.read_text("utf-8")
