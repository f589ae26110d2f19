"""``--memeval-gpus-per-worker K``: each xdist worker gets K GPUs and loads the model across them.

No GPU here: the assignment runs end to end with fake GPU ids (the workers only report what
they see, as in ``test_devices.py``), and the multi-device load is a real ``device_map`` load
of the demo checkpoint on the CPU, decoded by both paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.decode.fast import FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import load_model
from pytest_memeval.runtime.devices import (
    Assignment,
    DeviceError,
    DevicePool,
    describe_assignment,
    group_devices,
)

from ..conftest import ADAPTERS, BASE_MODEL, demo_records
from ..workerenv import RECORD_ENV, worker_envs


def test_gpus_are_grouped_per_worker() -> None:
    assert group_devices(("0", "1", "2", "3"), 1) == ("0", "1", "2", "3")
    assert group_devices(("0", "1", "2", "3"), 2) == ("0,1", "2,3")
    assert group_devices(("4", "5", "6", "7", "1"), 2) == ("4,5", "6,7")  # GPU 1 left over
    assert group_devices(("MIG-a", "MIG-b"), 2) == ("MIG-a,MIG-b",)
    with pytest.raises(DeviceError, match="only 1 GPU"):
        group_devices(("0",), 2)
    with pytest.raises(DeviceError, match="at least 1"):
        group_devices(("0",), 0)


def test_pool_of_groups_assigns_whole_groups_and_refuses_a_third_worker() -> None:
    pool = DevicePool(group_devices(("0", "1", "2", "3"), 2))
    assert pool.assign("gw0") == "0,1" and pool.assign("gw1") == "2,3"
    with pytest.raises(DeviceError, match="no free device for worker gw2"):
        pool.assign("gw2")
    assert pool.release("gw0") == "0,1"
    assert pool.assign("gw2") == "0,1"  # the replacement takes the freed group
    assignment = Assignment("2,3")
    assert assignment.gpus == ("2", "3") and not assignment.on_cpu
    assert describe_assignment(assignment) == "cuda:0-1 (physical 2,3)"
    assert Assignment("cpu").gpus == ()


@pytest.mark.slow
def test_auto_workers_is_gpus_over_k(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_memeval.runtime.device_binding import pytest_xdist_auto_num_workers

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = pytester.parseconfig(
        "-n", "2", "--memeval-gpus", "0,1,2,3,4", "--memeval-gpus-per-worker", "2"
    )
    assert pytest_xdist_auto_num_workers(config) == 2


@pytest.mark.slow
def test_each_worker_sees_its_k_gpus(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pytester.makeconftest(RECORD_ENV)
    pytester.makepyfile(test_x="def test_x():\n    pass\n\ndef test_y():\n    pass\n")
    # Written with a space and with '=', as users do.
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "--memeval-gpus",
        "0,1,2,3",
        "--memeval-gpus-per-worker=2",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "memeval: GPUs 0,1,2,3 (--memeval-gpus 0,1,2,3), 2 GPUs per worker *",
            "memeval: workers: gw0 -> cuda:0-1 (physical 0,1), gw1 -> cuda:0-1 (physical 2,3)",
        ]
    )
    envs = worker_envs(Path(pytester.path))
    seen = {w: e["CUDA_VISIBLE_DEVICES"] for w, e in envs.items()}
    assert seen == {"gw0": "0,1", "gw1": "2,3"}
    assert all(e["memeval_device"] == e["CUDA_VISIBLE_DEVICES"] for e in envs.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-n", "3", "--memeval-gpus", "0,1,2,3", "--memeval-gpus-per-worker", "2"],
            "*3 xdist workers with 2 GPUs each need 6 GPUs, but there are 4 (0,1,2,3, "
            "--memeval-gpus 0,1,2,3), i.e. at most 2 workers. Use -n 2.*",
        ),
        (
            ["-n", "1", "--memeval-gpus", "0", "--memeval-gpus-per-worker", "2"],
            "*--memeval-gpus-per-worker 2: only 1 GPU(s) (0) for a worker that needs 2*",
        ),
        (
            ["-n", "2", "--memeval-gpus", "0,1,2,3", "--memeval-gpus-per-worker", "2"]
            + ["--memeval-workers-per-gpu", "2"],
            "*cannot be combined: a worker either shares a GPU or spans several*",
        ),
    ],
)
def test_oversubscription_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.slow
def test_a_device_map_load_decodes_as_the_single_device_load() -> None:
    """A real ``device_map`` load through transformers/accelerate (a layer-by-layer map, and
    ``device="auto"`` as a worker with K GPUs loads): both decode paths agree with each other
    and with the plain load. On a CPU-only machine every layer lands on the CPU, so no
    cross-device hooks run here; that part needs GPUs."""
    import torch

    torch.set_num_threads(1)
    layers = {
        "gpt_neox.embed_in": "cpu",
        "gpt_neox.layers.0": "cpu",
        "gpt_neox.layers.1": "cpu",
        "gpt_neox.final_layer_norm": "cpu",
        "gpt_neox.rotary_emb": "cpu",
        "embed_out": "cpu",
    }
    mapped = load_model(BASE_MODEL, ADAPTERS / "oracle", device_map=layers)
    auto = load_model(BASE_MODEL, ADAPTERS / "oracle", device="auto")
    plain = load_model(BASE_MODEL, ADAPTERS / "oracle")
    assert mapped.device == "cpu" and auto.device == "cpu"
    scenarios = list(from_records(demo_records("oracle", 3), "demo").scenarios)
    expected = [ReferenceDecoder(plain, 16).rollout(s).outputs for s in scenarios]
    for loaded in (mapped, auto):
        reference = [ReferenceDecoder(loaded, 16).rollout(s).outputs for s in scenarios]
        fast = [r.outputs for r in FastDecoder(loaded, 16).decode(scenarios)]
        texts = [[(o.text, o.stopped) for o in r] for r in expected]
        assert [[(o.text, o.stopped) for o in r] for r in reference] == texts
        assert [[(o.text, o.stopped) for o in r] for r in fast] == texts
