"""pytest_memeval.compat.xdist against a real ``-n 2`` run (no model: a plain test project).

Each worker records, while each of its items runs, what :func:`pending_item_indices` reads
from xdist's real worker loop; the controller records :func:`is_xdist_controller` and
:func:`worker_specs`. The unit tests (tests/unit/test_compat.py) cover the fallbacks.
"""

from __future__ import annotations

import json

import pytest

CONFTEST = """
import json, os
import pytest
from pytest_memeval.compat.xdist import is_xdist_controller, pending_item_indices, worker_specs

ROWS = []

def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        ROWS.append({"who": "controller", "specs": worker_specs(config)})

def pytest_runtest_call(item):
    index = item.session.items.index(item)
    ROWS.append({"who": os.environ.get("PYTEST_XDIST_WORKER", "master"), "index": index,
                 "pending": pending_item_indices(item.config)})

def pytest_sessionfinish(session):
    ROWS.append({"who": os.environ.get("PYTEST_XDIST_WORKER", "master"),
                 "controller": is_xdist_controller(session.config)})
    name = os.environ.get("PYTEST_XDIST_WORKER", "master")
    with open(os.path.join(str(session.config.rootpath), f"rows-{name}.json"), "w") as f:
        json.dump(ROWS, f)
"""

TESTS = "\n".join(f"def test_{k:02d}():\n    pass\n" for k in range(40))


def _rows(pytester: pytest.Pytester, name: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads((pytester.path / f"rows-{name}.json").read_text())
    return rows


@pytest.fixture(autouse=True)
def _outside_any_outer_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs below name their processes from ``PYTEST_XDIST_WORKER``: when this suite
    itself runs under ``-n 2``, the outer worker's variables must not reach them."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
def test_pending_items_and_controller_under_real_xdist(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_many=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=40)
    controller = _rows(pytester, "master")
    assert {"who": "controller", "specs": ["popen", "popen"]} in controller
    assert {"who": "master", "controller": True} in controller
    seen_pending = 0
    for worker in ("gw0", "gw1"):
        rows = _rows(pytester, worker)
        assert rows[-1] == {"who": worker, "controller": False}
        ran = [int(r["index"]) for r in rows[:-1]]  # type: ignore[call-overload]
        for j, row in enumerate(rows[:-1]):
            pending = row["pending"]
            assert isinstance(pending, list)
            # What xdist has queued here is exactly what this worker runs next, in order
            # (it may be topped up later: a prefix of the rest).
            assert pending == ran[j + 1 : j + 1 + len(pending)], (worker, j)
            seen_pending += len(pending)
    assert seen_pending > 0  # the queue was read, not silently empty


@pytest.mark.slow
def test_pending_items_without_xdist_are_none(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_many=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=40)
    rows = _rows(pytester, "master")
    read = [r["pending"] for r in rows if "pending" in r]
    assert len(read) == 40  # one row per test, so the check below is not vacuous
    assert all(p is None for p in read)  # no xdist queue to read: None, not an empty queue
    assert rows[-1] == {"who": "master", "controller": False}
