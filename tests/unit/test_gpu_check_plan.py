"""What ``memeval gpu-check`` plans to run, on a GPU machine and on the CPU, without running
it: the GPU plan is checked here on a machine without one (``CUDA_VISIBLE_DEVICES`` names
the GPUs, as a job scheduler would)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_memeval.tools.gpu_check import SIZES, cli_arguments, make_plan


def _profiles(tmp_path: Path, *, real: bool) -> Path:
    gguf = tmp_path / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if real:
        gguf.parent.mkdir()
        gguf.write_bytes(b"GGUF")  # only its presence is planned on
    benchmark = '{ builder = "scene_memory", tasks = "tasks.jsonl" }'
    path = tmp_path / "profiles.toml"
    path.write_text(
        f'[tool.memeval.ckpt.oracle]\nmodel = "base"\nbenchmark = {benchmark}\n\n'
        f'[tool.memeval.ckpt.smol-oracle]\nmodel = "{gguf}"\nbenchmark = {benchmark}\n',
        encoding="utf-8",
    )
    return path


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_gpu_plan_binds_one_worker_per_gpu_and_benches_both_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    profiles = _profiles(tmp_path, real=True)
    plan = make_plan(_args("--profiles", str(profiles), "--cache-dir", "rel-cache"))
    assert plan.gpus == ("2", "3") and plan.workers == 2 and plan.budget_s == 570
    assert [s.title for s in plan.steps] == [
        "environment",
        "bench oracle float32",
        "bench oracle bfloat16",
        "pytest --ckpt oracle -n 2",
        "bench smol-oracle bfloat16",
        "bench smol-oracle float32",
    ]
    sizes = SIZES[("cuda", False)]
    cache = str(Path("rel-cache").resolve())  # the steps run elsewhere: absolute
    for step in plan.steps[1:3] + plan.steps[4:]:
        argv = step.argv or []
        assert argv[argv.index("--device") + 1] == "cuda"
        assert argv[argv.index("--cache-dir") + 1] == cache
        n = sizes.demo if "oracle " in step.title and "smol" not in step.title else sizes.real
        assert argv[argv.index("-n") + 1] == str(n)
        assert argv[argv.index("--turns") + 1] == ""
        assert step.command().endswith(f"-n {n} --turns '' --cache-dir {cache}")
    pytest_argv = plan.steps[3].argv or []
    assert "--memeval-gpus" not in pytest_argv  # every visible GPU, one worker each
    assert not any(a.startswith("--memeval-shard") for a in pytest_argv)  # all scenarios
    assert f"memeval_profiles={profiles}" in pytest_argv
    # Three workers on two GPUs: two may share one.
    more = make_plan(_args("--profiles", str(profiles), "--workers", "3"))
    assert more.steps[3].argv is not None
    assert more.steps[3].argv[-2:] == ["--memeval-workers-per-gpu", "2"]


def test_the_cpu_plan_is_smaller_and_says_the_real_model_is_absent(tmp_path: Path) -> None:
    profiles = _profiles(tmp_path, real=False)
    plan = make_plan(_args("--device", "cpu", "--quick", "--profiles", str(profiles)))
    assert plan.gpus == () and plan.workers == 2
    assert [s.title for s in plan.steps][-1] == "bench smol-oracle"
    absent = plan.steps[-1]
    assert absent.argv is None and "is absent" in absent.note and "memeval fetch" in absent.note
    argv = plan.steps[3].argv or []
    assert argv[argv.index("--memeval-gpus") + 1] == "cpu"
    assert "--memeval-shard=1/38" in argv and argv[argv.index("-n") + 1] == "2"
    bench = plan.steps[1].argv or []
    assert bench[bench.index("-n") + 1] == "3" and bench[bench.index("--device") + 1] == "cpu"
