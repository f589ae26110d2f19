"""``memeval gpu-check``: the first run on a borrowed GPU as one prepared command, recorded in
one report file.

In order, each step in its own process (a step that hangs is cut at its time limit, one that
runs out of memory or crashes leaves the next ones their GPU, and each model's memory is freed
before the next loads):

1. the environment: torch, transformers, the devices and the batching rules there;
2. ``memeval bench`` on the demo (``oracle``) in float32 and bfloat16: both paths, identical
   yes/no, the floor, the exact mode and the calibration's disagreement table;
3. ``pytest --ckpt oracle -n N``, each xdist worker bound to its GPU: the binding as the header
   shows it and as the records name it (``worker``, ``device``), the summary's throughput and
   ``mean batch``, the calibration line;
4. ``memeval bench`` on SmolLM2 (``smol-oracle``) in float32 and bfloat16, with the calibration
   store of the cache directory (a stored calibration of the same setting is reused and the
   fast time apart from the calibration printed). Without the GGUF file the report says so and
   the check goes on.

Scenario counts are sized so that on one GPU the whole check takes at most about ten minutes
(``--budget``, default 570 s: a step is cut at what is left, and a step with under 20 s left is
skipped and says so); ``--device cpu`` runs a smaller version of the same steps (few
scenarios, a shard of the pytest run), and ``--quick`` a smaller one still. The report
(Markdown) is rewritten atomically after every step, so a run cut short keeps the steps done.
See ``docs/gpu.md``, "The first GPU run: memeval gpu-check".

Exit status: 0 when every step that ran finished and every bench's predictions were
identical (a missing SmolLM2 file does not count against it); 1 otherwise; 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_memeval.core.profiles import Profile, ProfileError, resolve_profile
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.runtime.devices import DeviceError, resolve_devices
from pytest_memeval.tools.gpu_check.report import (
    Report,
    Step,
    StepResult,
    read_pytest_run,
    render,
    step_result,
)

__all__ = ["SIZES", "Sizes", "cli_arguments", "cli_main"]

DEMO_PROFILE = "oracle"
REAL_PROFILE = "smol-oracle"
DTYPES = ("float32", "bfloat16")
#: a step with less than this left of the budget is skipped (a model load alone takes longer)
MIN_STEP_S = 20.0
#: The eval module the pytest step runs: the plugin's own eval items, nothing else.
EVAL_MODULE = (
    "from pytest_memeval.evaluation import test_final_query, test_turns\n\n"
    '__all__ = ["test_final_query", "test_turns"]\n'
)


@dataclass(frozen=True)
class Sizes:
    """How much each step decodes: scenarios of the demo's and of SmolLM2's benches (the
    first N of the profile's benchmark), the pytest run's shard (``None``: every scenario),
    the most seconds one step may take and the whole check's default budget."""

    demo: int
    real: int
    shard: str | None
    step_s: int
    budget_s: int


#: Sizes by device and ``--quick``. On a GPU the reference path, not the fast one, sets the
#: time: a ``generate`` step of a small model is bound by kernel launches (several per layer),
#: not by arithmetic. The GPU sizes are an estimate, not yet a measurement (no GPU has run this
#: code): at a few milliseconds a step, 96 demo and 48 SmolLM2 scenarios should keep each bench
#: within two or three minutes, and the budget cuts whatever does not (the first SmolLM2 bench
#: also converts the GGUF file once, in the cache directory). The first report's seconds are
#: the ones to size the next run by.
SIZES: dict[tuple[str, bool], Sizes] = {
    ("cuda", False): Sizes(demo=96, real=48, shard=None, step_s=200, budget_s=570),
    ("cuda", True): Sizes(demo=24, real=8, shard="1/8", step_s=120, budget_s=300),
    ("cpu", False): Sizes(demo=12, real=1, shard="1/12", step_s=900, budget_s=3600),
    ("cpu", True): Sizes(demo=3, real=1, shard="1/38", step_s=300, budget_s=900),
}


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``memeval gpu-check``."""
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where to run (default cuda: every visible GPU; cpu: a smaller version of the "
        "same steps, to check the check)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the report file (Markdown; default gpu-check-<device>.md in the current "
        "directory), rewritten atomically after each step",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer scenarios in every step (a smoke test of the check itself)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole check (default 570 on a GPU); each step is cut at what is left",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="xdist workers of the pytest step (default: one per visible GPU; 2 on the CPU)",
    )
    parser.add_argument(
        "--profiles",
        type=Path,
        default=Path("pyproject.toml"),
        help="TOML file holding the oracle and smol-oracle profiles (default: ./pyproject.toml)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache directory for the GGUF conversion and the calibrations (default: as "
        "memeval bench and pytest)",
    )


def _fail(message: str) -> int:
    print(f"memeval gpu-check: error: {message}", file=sys.stderr)
    return 2


@dataclass(frozen=True)
class Plan:
    """What one check runs: its steps, and where and how big."""

    device: str
    sizes: Sizes
    budget_s: float
    workers: int
    gpus: tuple[str, ...]
    steps: list[Step]


@dataclass(frozen=True)
class Where:
    """What every step is given: the device, the profiles file and the cache directory, as
    absolute paths (the steps run in a temporary directory)."""

    device: str
    profiles: Path
    cache_dir: Path | None


def _bench_step(where: Where, profile: Profile, dtype: str, n: int) -> Step:
    argv = [sys.executable, "-m", "pytest_memeval", "bench", "--profiles", str(where.profiles)]
    argv += ["--profile", profile.name, "--device", where.device, "--dtype", dtype]
    argv += ["-n", str(n), "--turns", ""]
    if where.cache_dir is not None:
        argv += ["--cache-dir", str(where.cache_dir)]
    return Step(f"bench {profile.name} {dtype}", "bench", argv)


def _real_steps(where: Where, sizes: Sizes) -> list[Step]:
    """SmolLM2's benches, or one step that says why they cannot run."""
    try:
        real = resolve_profile(REAL_PROFILE, where.profiles)
    except ProfileError as exc:
        return [Step(f"bench {REAL_PROFILE}", "bench", None, f"not run: {exc}")]
    if real.model is None or not real.model.exists():
        return [
            Step(
                f"bench {REAL_PROFILE}",
                "bench",
                None,
                f"not run: the SmolLM2 file {real.model} is absent (fetch it with "
                "`memeval fetch`, see demo/ASSETS.md, then run the check again)",
            )
        ]
    if str(real.model).endswith(".gguf") and importlib.util.find_spec("gguf") is None:
        return [
            Step(
                f"bench {REAL_PROFILE}",
                "bench",
                None,
                "not run: reading the SmolLM2 GGUF file needs the gguf package, which is not "
                "installed (pip install 'pytest-memeval[gguf]')",
            )
        ]
    # bfloat16 first: batched 16-bit passes and the exact mode are the open questions there.
    return [_bench_step(where, real, dtype, sizes.real) for dtype in DTYPES[::-1]]


def _plugin_args() -> list[str]:
    """``-p pytest_memeval.plugin`` where the package is not installed (a checkout on
    ``PYTHONPATH``, as on a borrowed machine): pytest then finds no entry point for it. Where
    it is installed the entry point loads it, and naming it again would register it twice."""
    installed = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    return [] if "memeval" in installed else ["-p", "pytest_memeval.plugin"]


def _pytest_step(where: Where, sizes: Sizes, workers: int, gpus: tuple[str, ...]) -> Step:
    argv = [sys.executable, "-m", "pytest", *_plugin_args(), "test_eval.py"]
    argv += ["--ckpt", DEMO_PROFILE, "-n", str(workers), "-rN"]
    argv += ["-p", "no:randomly", "-p", "no:cacheprovider"]
    argv += ["-o", f"memeval_profiles={where.profiles}", "--memeval-out=run"]
    if where.device == "cpu":
        argv += ["--memeval-gpus", "cpu"]
    elif workers > len(gpus):
        argv += ["--memeval-workers-per-gpu", str(math.ceil(workers / len(gpus)))]
    if sizes.shard is not None:
        argv.append(f"--memeval-shard={sizes.shard}")
    if where.cache_dir is not None:
        argv.append(f"--memeval-cache-dir={where.cache_dir}")
    return Step(f"pytest --ckpt {DEMO_PROFILE} -n {workers}", "pytest", argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """The check's steps for ``args``; :class:`ProfileError`/:class:`DeviceError` on bad
    input."""
    where = Where(
        args.device,
        args.profiles.resolve(),
        args.cache_dir.resolve() if args.cache_dir is not None else None,
    )
    sizes = SIZES[(args.device, bool(args.quick))]
    gpus: tuple[str, ...] = ()
    if args.device == "cuda":
        gpus = resolve_devices(None, os.environ).gpus
        if not gpus:
            raise DeviceError("--device cuda: no GPU is visible here (nvidia-smi lists none)")
    workers = args.workers if args.workers is not None else (len(gpus) or 2)
    if workers < 1:
        raise DeviceError("--workers must be at least 1")
    budget = float(args.budget) if args.budget is not None else float(sizes.budget_s)
    demo = resolve_profile(DEMO_PROFILE, where.profiles)
    env = Step(
        "environment",
        "env",
        [sys.executable, "-c", ENV_PROBE, args.device],
        shown="python -c <versions, devices and their memory>",
    )
    steps = [env, *(_bench_step(where, demo, dtype, sizes.demo) for dtype in DTYPES)]
    steps.append(_pytest_step(where, sizes, workers, gpus))
    steps += _real_steps(where, sizes)
    return Plan(args.device, sizes, budget, workers, gpus, steps)


#: What the environment step prints (run in its own process: the check itself never
#: initialises CUDA, whose context would hold memory the later steps need).
ENV_PROBE = """
import platform, sys
import torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, {torch.get_num_threads()} torch threads")
if sys.argv[1] == "cuda":
    print(f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} visible GPU(s)")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, "
              f"compute capability {p.major}.{p.minor}, bf16 {torch.cuda.is_bf16_supported()}")
else:
    print(f"CPU: {platform.processor() or platform.machine()}")
"""


def _kill(proc: subprocess.Popen[str]) -> None:
    """End ``proc`` and what it started (xdist workers): it leads its own process group."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)


def run_step(step: Step, cwd: Path, limit_s: float) -> StepResult:
    """Run ``step`` in ``cwd`` for at most ``limit_s`` seconds, its output captured."""
    assert step.argv is not None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        step.argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        timed_out = True
    seconds = time.perf_counter() - started
    run = read_pytest_run(cwd / "run") if step.kind == "pytest" else None
    return step_result(step, out or "", proc.returncode, seconds, timed_out, limit_s, run)


def run_check(plan: Plan, out: Path, command: str) -> Report:
    """Run ``plan``'s steps in order, rewriting the report at ``out`` after each."""
    report = Report(plan.device, command, plan.budget_s, plan.workers, plan.gpus)
    atomic_write(out, render(report))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memeval-gpu-check-") as tmp:
        work = Path(tmp)
        (work / "test_eval.py").write_text(EVAL_MODULE, encoding="utf-8")
        for step in plan.steps:
            left = plan.budget_s - (time.perf_counter() - started)
            if step.argv is None:
                result = StepResult(step, "absent", 0.0, "", note=step.note)
            elif left < MIN_STEP_S:
                note = f"not run: {left:.0f} s of the {plan.budget_s:.0f} s budget left"
                result = StepResult(step, "skipped", 0.0, "", note=note)
            else:
                print(f"memeval gpu-check: {step.title} ...", flush=True)
                limit = min(left, plan.sizes.step_s)
                result = run_step(step, work, limit)
                if result.status == "timed out" and limit < plan.sizes.step_s:
                    result.note += " (what was left of the budget)"
            report.results.append(result)
            report.seconds = time.perf_counter() - started
            atomic_write(out, render(report))
    report.done = True
    atomic_write(out, render(report))
    return report


def _command(args: argparse.Namespace, out: Path) -> str:
    """The command as it ran, for the report's first line."""
    words = ["memeval gpu-check", f"--device {args.device}", f"--out {out}"]
    words += ["--quick"] if args.quick else []
    for option in ("budget", "workers", "cache_dir"):
        value = getattr(args, option)
        if value is not None:
            words.append(f"--{option.replace('_', '-')} {value}")
    return " ".join(words)


def cli_main(args: argparse.Namespace) -> int:
    """Run the check; see the module docstring."""
    try:
        plan = make_plan(args)
    except (ProfileError, DeviceError, OSError) as exc:
        return _fail(str(exc))
    out = (args.out or Path(f"gpu-check-{plan.device}.md")).resolve()
    report = run_check(plan, out, _command(args, out))
    for line in report.verdict_lines():
        print(f"memeval gpu-check: {line}")
    print(f"memeval gpu-check: report written to {out}")
    return 0 if report.ok else 1
