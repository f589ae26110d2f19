"""Scenario chunks under xdist: every item of a scenario on one worker, full fast-path batches.

A focused test drives :class:`~pytest_memeval.runtime.scheduler.ScenarioScheduling` with stand-in
worker nodes (what xdist's DSession calls on it: add, collect, schedule, complete, crash);
an end-to-end run with ``-n 2`` on the demo checkpoint shows the batches in the summary and
predicts what the run without xdist predicts.
"""

from __future__ import annotations

import json
import re

import pytest

from pytest_memeval.core.benchmark import from_records
from pytest_memeval.core.ids import IdMap
from pytest_memeval.decode.batches import length_batches
from pytest_memeval.decode.fast import DEFAULT_MAX_BATCH_TOKENS, FORWARD_MIN_FILL
from pytest_memeval.model.prompts import conversation_ids
from pytest_memeval.runtime.scheduler import ScenarioScheduling

from ..conftest import BASE_MODEL, MemevalProject, demo_records
from ..runfactory import content
from ..xdistsim import FakeNode


def collection(n: int) -> tuple[list[str], set[str]]:
    # Plain ids: odd ones (brackets, spaces) are the scope function's business, tested apart.
    ids = [f"s{k}" for k in range(n)]
    items = [f"test_eval.py::test_{name}[{sid}]" for sid in ids for name in ("final", "turns")]
    return [*items, "test_other.py::test_plain"], set(ids)


def scenario_of(nodeid: str) -> str:
    return nodeid[nodeid.index("[") + 1 : -1] if "[" in nodeid else nodeid


def demo_conversation_lengths(n: int) -> list[int]:
    """Token counts of the first ``n`` oracle demo scenarios' conversations."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BASE_MODEL), local_files_only=True)
    scenarios = from_records(demo_records("oracle", n), "demo").scenarios
    return [len(conversation_ids(tokenizer, s)) for s in scenarios]


def test_chunks_keep_scenarios_whole_and_shrink_at_the_end(pytester: pytest.Pytester) -> None:
    items, ids = collection(10)
    sched = ScenarioScheduling(
        pytester.parseconfig("--dist", "load", "--tx", "2*popen"), None, IdMap(ids), chunk=4
    )
    nodes = [FakeNode("gw0"), FakeNode("gw1")]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, items)
    sched.schedule()
    # Each worker's first message: four whole scenarios (eight items), in queue order.
    assert [len(node.sent) for node in nodes] == [1, 1]
    first = [[scenario_of(items[i]) for i in node.sent[0]] for node in nodes]
    assert [len(set(f)) for f in first] == [4, 4] and [len(f) for f in first] == [8, 8]
    # gw0 works through its chunk; at its last scenario it is topped up, with what is left
    # split evenly over the two workers (3 scopes left: 2 now).
    for i in nodes[0].sent[0][:-3]:
        sched.mark_test_complete(nodes[0], i)
    assert len(nodes[0].sent) == 1
    sched.mark_test_complete(nodes[0], nodes[0].sent[0][-3])  # its last scenario starts
    assert len(nodes[0].sent) == 2 and len({scenario_of(items[i]) for i in nodes[0].sent[1]}) == 2
    # A crash on gw1 in the middle of its chunk: the running item is reported (not rerun),
    # the chunk's other scenarios go back to the queue, whole.
    running = nodes[1].sent[0][2]
    sched.mark_test_complete(nodes[1], nodes[1].sent[0][0])
    sched.mark_test_complete(nodes[1], nodes[1].sent[0][1])
    assert sched.remove_node(nodes[1]) == items[running]
    requeued = [n for unit in sched.work_queue.values() for n, done in unit.items() if not done]
    assert items[running] not in requeued and items[nodes[1].sent[0][0]] not in requeued
    assert len({scenario_of(n) for n in requeued if "test_eval" in n}) == 3
    # Everything still ends up sent exactly once, whole scenarios per message.
    finished = {*nodes[0].sent[0][:-2], *nodes[1].sent[0][:3]}
    while sched.work_queue:
        for i in [i for batch in nodes[0].sent for i in batch if i not in finished]:
            finished.add(i)
            sched.mark_test_complete(nodes[0], i)
    for node in nodes:
        for batch in node.sent:
            scenarios = {scenario_of(items[i]) for i in batch if "test_eval" in items[i]}
            for sid in scenarios - {scenario_of(items[running])}:
                assert sum(scenario_of(items[i]) == sid for i in batch) == 2
    every = [items[i] for node in nodes for batch in node.sent for i in batch]
    assert set(every) == set(items)
    # Sent twice: what the crashed worker had not run (its crashed item is not rerun).
    again = {n for n in every if every.count(n) > 1}
    assert again == {items[i] for i in nodes[1].sent[0][3:]}


def test_chunk_of_one_is_xdist_loadscope(pytester: pytest.Pytester) -> None:
    items, ids = collection(4)
    sched = ScenarioScheduling(
        pytester.parseconfig("--dist", "load", "--tx", "1*popen"), None, IdMap(ids), chunk=1
    )
    node = FakeNode("gw0")
    sched.add_node(node)
    sched.add_node_collection(node, items)
    sched.schedule()
    # xdist's loadscope: one scope per message, topped up to at least two scopes at start.
    assert [len(batch) for batch in node.sent] == [2, 2]


@pytest.mark.slow
def test_two_workers_decode_their_chunks(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_memeval.decode.fast import DEFAULT_BATCH_SIZES

    batch = DEFAULT_BATCH_SIZES["cpu"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    memeval_project.write(demo_records("oracle", 10))
    runs = {}
    for label, extra in {"serial": [], "xdist": ["-n", "2", "-v"]}.items():
        out = memeval_project.path / "runs" / label
        result = memeval_project.run("--ckpt", "demo", "--memeval-out", str(out), *extra)
        result.stdout.fnmatch_lines(
            [f"throughput: * scenarios/s over * s (decode fast, mean batch *.* of {batch})"]
        )
        metrics = json.loads((out / "metrics.json").read_text("utf-8"))
        predictions = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        assert metrics["complete"] and len(predictions) == 10
        runs[label] = (metrics, predictions, result.stdout.lines)
    # Without xdist the worker prefetches all 10 scenarios (PREFETCH_SIZE 16) and decodes
    # them in the forward passes the decoder groups them in: each record names its pass's size.
    serial_metrics, serial_predictions, _ = runs["serial"]
    lengths = demo_conversation_lengths(10)
    groups = length_batches(lengths, batch, DEFAULT_MAX_BATCH_TOKENS, FORWARD_MIN_FILL)
    assert 1 < len(groups) < 10  # these 10 demo scenarios differ in length: passes of 1-3
    expected = sorted(len(g) for g in groups for _ in g)
    assert sorted(p["decode_batch"] for p in serial_predictions) == expected
    assert serial_metrics["timing"]["mean_batch"] == round(sum(expected) / 10, 3)
    # Under xdist, 10 scenarios on two workers in chunks of up to the CPU batch, shrinking at
    # the end of the queue (batch 8: 5 + 3, then 1 + 1: the chunk sizes are asserted above, on
    # the scheduler itself; which worker takes which depends on timing). Each chunk is cut
    # into passes as above: a pass of b scenarios leaves b records saying b, and the
    # summary's mean is theirs.
    metrics, predictions, lines = runs["xdist"]
    assert metrics["timing"]["batch_size"] == batch
    sizes = [p["decode_batch"] for p in predictions]
    assert set(sizes) <= set(range(1, batch + 1))
    assert all(sizes.count(b) % b == 0 for b in set(sizes))
    assert metrics["timing"]["mean_batch"] == round(sum(sizes) / 10, 3) > 1.0
    # Every item of a scenario ran on the worker that decoded it.
    placed: dict[str, set[str]] = {}
    for line in lines:
        m = re.match(r"^\[(gw\d+)\] .*(?:PASSED|FAILED|XFAIL|XPASS) .*\[(.+)\]", line)
        if m:
            placed.setdefault(m.group(2), set()).add(m.group(1))
    by_id = {p["id"]: p["worker"] for p in predictions}
    assert set(placed) == set(by_id)
    assert all(placed[sid] == {by_id[sid]} for sid in by_id)
    assert content(runs["serial"][1]) == content(predictions)


def test_chunk_is_the_fast_batch_size_of_the_workers_devices(pytester: pytest.Pytester) -> None:
    from pytest_memeval.decode.fast import DEFAULT_ACCELERATOR_BATCH_SIZE, DEFAULT_BATCH_SIZES
    from pytest_memeval.runtime.device_binding import BINDER_NAME, XdistDeviceBinder
    from pytest_memeval.runtime.devices import DeviceSource
    from pytest_memeval.runtime.scheduler import chunk_size

    config = pytester.parseconfig("--dist", "load", "--tx", "2*popen")
    assert chunk_size(config, "fast") == DEFAULT_BATCH_SIZES["cpu"] == 8
    assert chunk_size(config, "reference") == 1
    binder = XdistDeviceBinder(DeviceSource(("0", "1"), "test"), 1, 1, "test", 2)
    config.pluginmanager.register(binder, BINDER_NAME)
    assert chunk_size(config, "fast") == DEFAULT_ACCELERATOR_BATCH_SIZE == 16
    assert chunk_size(config, "replay") == 1
