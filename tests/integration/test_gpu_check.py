"""``memeval gpu-check --device cpu --quick``: the check a borrowed GPU runs, run on the CPU
first (the demo's benches, a bound ``pytest -n 2`` shard, one report), with the SmolLM2 file
absent: the report says so and the check goes on."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pytest_memeval.runtime.devices import resolve_devices
from pytest_memeval.tools.cli import main

from ..conftest import ADAPTERS, BASE_MODEL, DEMO, fork_started_programs


def _profiles(tmp_path: Path) -> Path:
    """The repository's oracle profile with absolute paths, and a smol-oracle whose GGUF file
    is absent."""
    data = DEMO / "data"
    benchmark = (
        f'{{ builder = "scene_memory", tasks = "{data / "tasks_val.jsonl"}", '
        f'init_state_manifest = "{data / "init_state_manifest.jsonl"}" }}'
    )
    path = tmp_path / "profiles.toml"
    path.write_text(
        f"""
[tool.memeval.ckpt.oracle]
model = "{BASE_MODEL}"
adapter = "{ADAPTERS / "oracle"}"
benchmark = {benchmark}
generation = {{ max_new_tokens = 16 }}

[tool.memeval.ckpt.smol-oracle]
model = "{tmp_path / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"}"
benchmark = {benchmark}
generation = {{ max_new_tokens = 16 }}
""",
        encoding="utf-8",
    )
    return path


# Two benches and a pytest -n 2 shard of a few scenarios each: process start-ups are most of
# its time (about half a minute on a quiet 2-core machine): the steps fork from the tests'
# fork server instead (tests/forkserver.py).
@pytest.mark.slow
def test_the_cpu_check_benches_runs_bound_workers_and_says_what_is_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fork_started_programs(monkeypatch)
    out = tmp_path / "report" / "gpu-check.md"
    profiles = _profiles(tmp_path)
    argv = ["gpu-check", "--device", "cpu", "--quick", "--out", str(out)]
    code = main([*argv, "--profiles", str(profiles), "--cache-dir", str(tmp_path / "cache")])
    text = out.read_text(encoding="utf-8")
    assert code == 0, text
    # One file, written atomically: no temporary sibling left beside it.
    assert [p.name for p in out.parent.iterdir()] == ["gpu-check.md"]
    terminal = capsys.readouterr().out
    assert f"report written to {out}" in terminal
    for line in (
        "- environment: ok",
        "- bench oracle float32: ok",
        "- bench oracle bfloat16: ok",
        "- pytest --ckpt oracle -n 2: ok",
        "- bench smol-oracle: absent (not run: the SmolLM2 file ",
    ):
        assert line in text, line
    assert "is absent (fetch it with `memeval fetch`" in text
    assert re.search(r"finished after \d+ s of 900 s; every step ran, predictions identical", text)
    # Both demo benches: both paths, identical, the floor, the exact mode.
    for dtype in ("float32", "bfloat16"):
        row = re.search(rf"^\| bench oracle {dtype} \| ok \| [\d.]+ \| (.*) \|$", text, re.M)
        assert row, text
        speedup, identical, reference, fast, floor, times, mode = row.group(1).split(" | ")
        assert identical == "yes" and float(floor) > 0 and float(times.rstrip("x")) > 0
        assert float(reference) > 0 and float(fast) > 0 and speedup.endswith("x")
        assert mode.startswith(("on:", "off:"))
    assert text.count("Exact stage and calibration:") == 2
    assert re.search(r"^calibration: measured now, .* stored in ", text, re.M)
    # The pytest step: the binding as the header shows it and as the records name it.
    assert "memeval: workers: gw0 -> cpu (1 thread), gw1 -> cpu (1 thread)" in text
    bound = re.findall(r"^\| (gw\d) \| (cpu[^|]*) \| (\d+) \|$", text, re.M)
    assert {w for w, _, _ in bound} == {"gw0", "gw1"}, text
    assert sum(int(n) for _, _, n in bound) == 5  # shard 1/38 of 189
    assert re.search(r"metrics\.json: 5 scenarios, .* mean batch [\d.]+ of 8", text)
    assert "- float32: cpu: up to 8 scenarios a pass, at least 90% real tokens" in text


def test_bad_input_stops_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu-check.md"
    missing = ["gpu-check", "--device", "cpu", "--out", str(out)]
    assert main([*missing, "--profiles", str(tmp_path / "none.toml")]) == 2
    assert "memeval gpu-check: error:" in capsys.readouterr().err
    if not resolve_devices(None, os.environ).gpus:
        assert main(["gpu-check", "--out", str(out), "--profiles", str(_profiles(tmp_path))]) == 2
        assert "--device cuda: no GPU is visible here" in capsys.readouterr().err
    assert not out.exists()
