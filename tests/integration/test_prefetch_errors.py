"""A decoder whose batched prefetch raises is never silent (runtime/worker.py ``_prefetch``).

The project's conftest wraps the real decoder (demo checkpoint, fast path) so that its
``prefetch`` raises what the test asks for, and logs each call:

* out of memory (torch's own ``OutOfMemoryError``): one ``PrefetchWarning`` in pytest's
  warnings summary naming the scenarios, prefetch off from then on, and the run's results
  the same as a run whose prefetch works;
* anything else (a bug): the item that asked errors with ``PrefetchError`` (the batch's
  scenarios, the original exception chained); the other scenarios are decoded alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..conftest import MemevalProject, demo_records

# Each test runs the demo model end to end, some twice (a clean run to compare with): tens of
# seconds, outside the inner loop.
pytestmark = pytest.mark.slow

PREFETCH_FAILS_CONFTEST = """
import os
from pathlib import Path

import pytest
import torch


class PrefetchFails:
    '''The real decoder, except that prefetch raises what PREFETCH_FAILS names.'''

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def rollout(self, scenario):
        return self.inner.rollout(scenario)

    def prefetch(self, scenarios):
        with Path(os.environ["PREFETCH_LOG"]).open("a", encoding="utf-8") as log:
            log.write(" ".join(s.id for s in scenarios) + "\\n")
        kind = os.environ.get("PREFETCH_FAILS", "")
        if kind == "oom":
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected)"
            )
        if kind == "bug":
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str' (injected)")
        self.inner.prefetch(scenarios)


@pytest.hookimpl(hookwrapper=True)
def pytest_memeval_make_decoder(config, profile, path, device):
    outcome = yield
    outcome.force_result(PrefetchFails(outcome.get_result()))
"""

# Fields that say where and how fast a record was made, not what was predicted.
PLACEMENT = ("worker", "device", "decode_s", "decode_batch", "decode_batch_size")
N = 6


@pytest.fixture
def project(
    memeval_project: MemevalProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> MemevalProject:
    memeval_project.write(demo_records("oracle", N))
    memeval_project.pytester.makeconftest(PREFETCH_FAILS_CONFTEST)
    monkeypatch.setenv("PREFETCH_LOG", str(tmp_path / "prefetch.log"))
    return memeval_project


def _calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "prefetch.log"
    lines = log.read_text("utf-8").splitlines() if log.exists() else []
    return [line.split() for line in lines]


def _shown(ids: list[str]) -> str:
    return ", ".join(repr(i) for i in ids)


def _content(project: MemevalProject, ckpt: str) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k not in PLACEMENT} for r in project.predictions(ckpt)]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["no-xdist", "n2"])
def test_out_of_memory_in_prefetch_is_said_once_and_results_stay_the_same(
    project: MemevalProject,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    workers: list[str],
) -> None:
    out = project.path / "runs"
    clean = project.run("--ckpt", "demo", f"--memeval-out={out / 'clean'}", *workers)
    assert _calls(tmp_path), "the run must prefetch, or this test shows nothing"
    assert "PrefetchWarning" not in clean.stdout.str()
    (tmp_path / "prefetch.log").unlink()

    monkeypatch.setenv("PREFETCH_FAILS", "oom")
    result = project.run("--ckpt", "demo", "--memeval-out", str(out / "oom"), *workers)
    text = result.stdout.str()
    calls = _calls(tmp_path)
    # Prefetch is off after the failure: one call per process that prefetched.
    assert 1 <= len(calls) <= (2 if workers else 1), calls
    warned = [line for line in text.splitlines() if "PrefetchWarning:" in line]
    assert len(warned) == len(calls), text
    for batch in calls:
        assert any(
            re.search(
                re.escape(
                    f"batched prefetch of {len(batch)} scenarios ({_shown(batch)}) ran out of "
                    "memory on X (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 "
                    "GiB (injected)); decoding one scenario at a time from now on in this "
                    "process (same results, slower). Lower the fast path's batch_size or "
                    "max_batch_tokens"
                ).replace("X", r"(worker gw\d on )?cpu \(\d+ threads?\)"),
                line,
            )
            for line in warned
        ), (batch, warned)
    assert result.ret == clean.ret, text
    outcomes, clean_outcomes = result.parseoutcomes(), clean.parseoutcomes()
    assert outcomes.pop("warnings") == clean_outcomes.pop("warnings", 0) + len(warned)
    assert outcomes == clean_outcomes
    # Same results as the run whose prefetch worked, and a complete run.
    assert _content(project, "oom") == _content(project, "clean")
    assert len(project.predictions("oom")) == N and project.metrics("oom")["complete"] is True


def test_any_other_prefetch_error_fails_the_item_that_asked_naming_the_batch(
    project: MemevalProject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PREFETCH_FAILS", "bug")
    result = project.run("--ckpt", "demo", "-p", "no:randomly")
    text = result.stdout.str()
    calls = _calls(tmp_path)
    assert len(calls) == 1, calls  # off after the failure: one error, not one per batch
    batch = calls[0]
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text
    assert result.parseoutcomes()["errors"] == 1, text
    assert "TypeError: unsupported operand type(s) for +: 'int' and 'str' (injected)" in text
    assert "The above exception was the direct cause of the following exception" in text
    said = re.escape(
        f"PrefetchError: the decoder's prefetch of {len(batch)} scenarios ({_shown(batch)}) "
        "failed on cpu (X) with TypeError: unsupported operand type(s) for +: 'int' and 'str' "
        "(injected); prefetch is off for the rest of this process (the other scenarios are "
        "decoded one at a time)"
    ).replace("X", r"\d+ threads?")
    assert re.search(said, " ".join(text.split())), text
    # Only the item that asked errors; every scenario, its own included, still has its record
    # (decoded alone for its other item and for the scenarios after it).
    errors = [line for line in text.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1 and f"[{batch[0]}]" in errors[0], errors
    assert [r["id"] for r in project.predictions()] == [r["id"] for r in demo_records("oracle", N)]
    assert project.metrics()["complete"] is True
