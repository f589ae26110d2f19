"""One device per xdist worker: the device list, its assignment, and each worker applying it.

No GPU here: the end-to-end runs hand out fake GPU ids and check what each worker process
sees (its ``CUDA_VISIBLE_DEVICES`` and ``workerinput``) from a conftest in the project,
without --ckpt so that nothing tries to use the fake GPUs. The eval itself on CPU workers is
covered by ``test_merge.py`` (records note ``cpu (N threads)``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

# Imported here, not in a test: pytester drops the modules a test imports once it ends, and
# torch's extension modules cannot load twice in one process (a later test would fail).
import torch

from pytest_memeval.runtime.devices import (
    Assignment,
    DeviceError,
    DevicePool,
    apply_assignment,
    describe_assignment,
    detect_gpus,
    device_label,
    parse_gpu_list,
    parse_nvidia_smi_list,
    resolve_devices,
    threads_per_worker,
    worker_device,
)

from ..conftest import MemevalProject, demo_records, write_jsonl
from ..runfactory import replay_source
from ..workerenv import RECORD_ENV, worker_envs

# -- the device list ------------------------------------------------------------------------


def test_parse_gpu_list() -> None:
    assert parse_gpu_list("0,1, 3", what="x") == ("0", "1", "3")
    assert parse_gpu_list("GPU-8a7f3c2e-1111", what="x") == ("GPU-8a7f3c2e-1111",)
    with pytest.raises(DeviceError, match="GPU 1 is listed twice"):
        parse_gpu_list("1,0,1", what="--memeval-gpus")
    with pytest.raises(DeviceError, match="empty device id"):
        parse_gpu_list("0,,1", what="--memeval-gpus")
    with pytest.raises(DeviceError, match="not a GPU index"):
        parse_gpu_list("0 1", what="--memeval-gpus")


def test_explicit_list_wins_and_stays_inside_an_outer_cuda_visible_devices() -> None:
    src = resolve_devices("0,1", {})
    assert src.gpus == ("0", "1") and src.origin == "--memeval-gpus 0,1"
    assert resolve_devices("6,4", {"CUDA_VISIBLE_DEVICES": "4,5,6"}).gpus == ("6", "4")
    with pytest.raises(DeviceError, match=r"GPU 0,1 is outside CUDA_VISIBLE_DEVICES=4,5"):
        resolve_devices("0,1", {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert resolve_devices("cpu", {"CUDA_VISIBLE_DEVICES": "4,5"}).on_cpu


@pytest.mark.parametrize(
    ("outer", "gpus"),
    [("4,5,6,7", ("4", "5", "6", "7")), ("", ()), ("-1", ()), ("4,-1,5", ("4",))],
)
def test_outer_cuda_visible_devices_is_respected(outer: str, gpus: tuple[str, ...]) -> None:
    """A job given GPUs 4-7 gets 4-7, never 0-3; an empty or -1 list means no GPU."""
    src = resolve_devices(None, {"CUDA_VISIBLE_DEVICES": outer})
    assert src.gpus == gpus
    assert src.origin == f"CUDA_VISIBLE_DEVICES={outer}"


NVIDIA_SMI_L = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)
  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)
  MIG 3g.40gb     Device  1: (UUID: MIG-ffffffff-0000-1111-2222-333333333333)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-44444444-5555-6666-7777-888888888888)
"""


def test_nvidia_smi_listing_with_mig() -> None:
    """A GPU split into MIG instances is bound per instance (one CUDA process, one MIG)."""
    assert parse_nvidia_smi_list(NVIDIA_SMI_L) == (
        "0",
        "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "MIG-ffffffff-0000-1111-2222-333333333333",
        "2",
    )


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A PATH holding only a directory we control (for a stand-in ``nvidia-smi``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    yield bin_dir


def _fake_nvidia_smi(bin_dir: Path, script: str) -> None:
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script, "utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_detection_runs_nvidia_smi_in_its_own_process(fake_path: Path) -> None:
    assert detect_gpus() == ((), "no GPU found (nvidia-smi not on PATH)")
    # printf is a shell builtin: the stand-in needs nothing else from PATH.
    _fake_nvidia_smi(fake_path, f"[ \"$1\" = -L ] || exit 3\nprintf '%s' '{NVIDIA_SMI_L}'\n")
    gpus, how = detect_gpus()
    assert len(gpus) == 4 and how == "detected with nvidia-smi -L"
    assert resolve_devices(None, {}).gpus == gpus  # no option, no outer variable: detected
    _fake_nvidia_smi(fake_path, 'echo "NVIDIA-SMI has failed: no driver" >&2\nexit 9\n')
    assert detect_gpus() == ((), "no GPU found (nvidia-smi -L: NVIDIA-SMI has failed: no driver)")


# -- assignment -----------------------------------------------------------------------------


def test_pool_spreads_workers_and_gives_a_replacement_the_freed_device() -> None:
    pool = DevicePool(("4", "5"), per_device=2)
    assert [pool.assign(f"gw{i}") for i in range(4)] == ["4", "5", "4", "5"]
    with pytest.raises(DeviceError, match="4 workers hold all 4 slots"):
        pool.assign("gw4")
    assert pool.release("gw1") == "5"
    assert pool.assign("gw4", prefer="4") == "5"  # "4" is full: the free slot, not a duplicate
    assert pool.assign("gw4") == "5"  # asking again changes nothing
    assert sorted(pool.holders.values()) == ["4", "4", "5", "5"]


def test_threads_are_divided_among_workers() -> None:
    assert threads_per_worker(4, {}, cores=16) == (4, "16 cores / 4 workers")
    assert threads_per_worker(3, {}, cores=2) == (1, "2 cores / 3 workers")
    assert threads_per_worker(2, {"OMP_NUM_THREADS": "3"}, cores=16) == (3, "OMP_NUM_THREADS=3")


def test_apply_assignment_sets_the_environment() -> None:
    env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "4,5"}
    apply_assignment(Assignment("5", 8), env)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "5",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "OMP_NUM_THREADS": "8",
    }
    env = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    apply_assignment(Assignment("cpu", 2), env)
    # On the CPU the worker sees no GPU at all; a user's device order is kept.
    assert env == {
        "CUDA_VISIBLE_DEVICES": "",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        "OMP_NUM_THREADS": "2",
    }


def test_labels() -> None:
    assert describe_assignment(Assignment("5", 4)) == "cuda:0 (physical 5)"
    assert describe_assignment(Assignment("MIG-aaaa", 4)) == "cuda:0 (MIG-aaaa)"
    assert describe_assignment(Assignment("cpu", 1)) == "cpu (1 thread)"
    assert describe_assignment(Assignment("cpu", 3)) == "cpu (3 threads)"


def _as_worker(config: pytest.Config, workerinput: dict[str, object]) -> None:
    """Make ``config`` look like an xdist worker's (xdist sets this attribute)."""
    config.workerinput = workerinput  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_worker_applies_its_share_of_threads_to_torch(pytester: pytest.Pytester) -> None:
    """What the decoder gets in an xdist worker: its device, and torch limited to its share."""
    config = pytester.parseconfig()
    before = torch.get_num_threads()
    want = 1 if before > 1 else 2
    _as_worker(config, {"workerid": "gw0", "memeval_device": "cpu", "memeval_torch_threads": want})
    try:
        assert worker_device(config) == "cpu"
        assert torch.get_num_threads() == want
        assert device_label(config, "cpu") == describe_assignment(Assignment("cpu", want))
        _as_worker(
            config, {"workerid": "gw1", "memeval_device": "5", "memeval_torch_threads": want}
        )
        assert worker_device(config) == "cuda:0"  # the one GPU it can see (CUDA not touched)
        assert device_label(config, "cuda:0") == "cuda:0 (physical 5)"
    finally:
        torch.set_num_threads(before)


# -- end to end: xdist workers, fake GPUs ----------------------------------------------------


@pytest.mark.slow
def test_each_worker_gets_its_own_gpu_and_a_replacement_gets_the_freed_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pytester.makeconftest(RECORD_ENV)
    # gw0 dies (a real SIGKILL) on its first test; xdist starts gw2 in its place.
    pytester.makepyfile(
        test_crash="""
        import os, signal
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_work(i):
            if os.environ["PYTEST_XDIST_WORKER"] == "gw0":
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = pytester.runpytest_subprocess(
        "-n", "2", "--memeval-gpus", "0,1", "-p", "no:randomly", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines(
        [
            "memeval: GPUs 0,1 (--memeval-gpus 0,1), 1 worker(s) per GPU, * per worker *",
            "memeval: workers: gw0 -> cuda:0 (physical 0), gw1 -> cuda:0 (physical 1)",
            "*memeval: gw2 replaced gw0 (which went down) on cuda:0 (physical 0)",
        ]
    )
    envs = worker_envs(Path(pytester.path))
    assert set(envs) == {"gw0", "gw1", "gw2"}
    seen = {w: e["CUDA_VISIBLE_DEVICES"] for w, e in envs.items()}
    assert seen == {"gw0": "0", "gw1": "1", "gw2": "0"}
    for env in envs.values():
        # The process environment (set before Python started) and the plain data agree.
        assert env["memeval_device"] == env["CUDA_VISIBLE_DEVICES"]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["OMP_NUM_THREADS"] == str(env["memeval_torch_threads"])


def _replay_project(project: MemevalProject) -> None:
    """Two demo scenarios and a replay profile ``fixed`` of their benchmark answers."""
    project.write(
        n=2,
        profiles="""
        [tool.memeval.ckpt.fixed]
        kind = "replay"
        predictions = "preds.jsonl"
        benchmark = "bench.jsonl"
        """,
    )
    # The replay file is checked at configure: it needs a line per scenario even unused.
    write_jsonl(project.path / "preds.jsonl", replay_source(demo_records("oracle", 2)))


@pytest.mark.slow
def test_outer_cuda_visible_devices_is_split_among_workers(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --ckpt (binding on) and no --memeval-gpus, a job given GPUs 4,5 uses 4 and 5."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    # Any --ckpt turns binding on; a replay profile needs no model (nothing touches the GPUs).
    _replay_project(memeval_project)
    memeval_project.pytester.makeconftest(RECORD_ENV)
    memeval_project.pytester.makepyfile(test_env="def test_env():\n    pass\n")
    # Named by path: the run evaluates nothing (naming only other tests is how; deselecting
    # every eval item with -k is refused), yet binding is on.
    result = memeval_project.run("--ckpt", "fixed", "-n", "2", "test_env.py")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "memeval: GPUs 4,5 (CUDA_VISIBLE_DEVICES=4,5), 1 worker(s) per GPU, *",
            "memeval: workers: gw0 -> cuda:0 (physical 4), gw1 -> cuda:0 (physical 5)",
        ]
    )
    envs = worker_envs(memeval_project.path)
    assert {w: e["CUDA_VISIBLE_DEVICES"] for w, e in envs.items()} == {"gw0": "4", "gw1": "5"}


@pytest.mark.slow
def test_more_workers_than_gpus_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "3", "--memeval-gpus", "0,1", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*3 xdist workers but 2 GPU(s) (0,1, --memeval-gpus 0,1) with 1 worker(s) per GPU, "
            "i.e. at most 2 workers. Use -n 2, or allow several workers per GPU with "
            "--memeval-workers-per-gpu 2.*"
        ]
    )


@pytest.mark.slow
def test_without_ckpt_or_gpus_the_plugin_binds_nothing(pytester: pytest.Pytester) -> None:
    """Another project's `pytest -n 2` with the plugin installed is left alone."""
    pytester.makeconftest(RECORD_ENV)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.OK
    envs = worker_envs(Path(pytester.path))
    assert len(envs) == 2
    assert all(e["memeval_device"] is None for e in envs.values())
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert all(e["CUDA_VISIBLE_DEVICES"] == outer for e in envs.values())


@pytest.mark.slow
def test_auto_workers_is_one_per_gpu_slot(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_memeval.runtime.device_binding import pytest_xdist_auto_num_workers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")

    def config(*args: str) -> pytest.Config:
        # With -n the (in-process) configuration binds nothing in this test process.
        return pytester.parseconfig("-n", "2", *args)

    assert pytest_xdist_auto_num_workers(config("--memeval-workers-per-gpu", "2")) is None
    gpus = config("--memeval-gpus", "0,2", "--memeval-workers-per-gpu", "2")
    assert pytest_xdist_auto_num_workers(gpus) == 4
    assert pytest_xdist_auto_num_workers(config("--ckpt", "x")) == 3  # CUDA_VISIBLE_DEVICES
    assert pytest_xdist_auto_num_workers(config("--memeval-gpus", "cpu")) is None


@pytest.mark.slow
def test_single_process_is_bound_to_the_first_listed_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without -n, --memeval-gpus binds pytest itself, before conftests are imported."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,7")
    pytester.makeconftest("import os\nSEEN_AT_IMPORT = os.environ.get('CUDA_VISIBLE_DEVICES')\n")
    pytester.makepyfile(
        test_env="""
        import os
        from conftest import SEEN_AT_IMPORT

        def test_env():
            assert SEEN_AT_IMPORT == os.environ["CUDA_VISIBLE_DEVICES"] == "7"
        """
    )
    result = pytester.runpytest_subprocess("--memeval-gpus", "7,3", "-p", "no:randomly")
    result.stdout.fnmatch_lines(
        [
            "memeval: device cuda:0 (physical 7) from --memeval-gpus 7,3 (single process: *",
            "*1 passed*",
        ]
    )


TORCH_SEEN = """
import os
import sys


def pytest_sessionfinish(session):
    process = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    (session.config.rootpath / f"torch-{process}.txt").write_text(str("torch" in sys.modules))
"""


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["n0", "n2"])
def test_a_replay_run_imports_no_torch(memeval_project: MemevalProject, xdist: list[str]) -> None:
    """A replay decodes nothing: no process of its run picks a device or imports torch (two
    seconds of each process's start), and its records say it ran on no device."""
    _replay_project(memeval_project)
    memeval_project.pytester.makeconftest(TORCH_SEEN)
    # Fresh interpreters (not memeval_project.run: the tests' fork server has torch imported).
    result = memeval_project.pytester.runpytest_subprocess("--ckpt", "fixed", *xdist)
    # The replayed turns are not all right (those items fail); the run itself is whole.
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    metrics = memeval_project.metrics("fixed")
    assert metrics["complete"] is True and metrics["n"] == 2
    seen = {p.stem: p.read_text() for p in memeval_project.path.glob("torch-*.txt")}
    expected = {"torch-controller"} | ({"torch-gw0", "torch-gw1"} if xdist else set())
    assert seen == dict.fromkeys(expected, "False")
    assert [r["device"] for r in memeval_project.predictions("fixed")] == ["none (replay)"] * 2
