"""The scenario record on a test report survives pytest's report serialisation (the hooks
xdist sends reports to the controller with), and can be dropped again."""

from __future__ import annotations

import json

import pytest

from pytest_memeval.compat.pytest import drop_report_record, report_record, set_report_record


def _report() -> pytest.TestReport:
    return pytest.TestReport(
        nodeid="test_eval.py::test_final_query[a b]",
        location=("test_eval.py", 1, "test_final_query[a b]"),
        keywords={},
        outcome="passed",
        longrepr=None,
        when="call",
    )


def test_record_round_trips_through_report_serialisation(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    record = {"id": "a b", "final_match": True, "turns": [{"index": 0, "match": None}]}
    report = _report()
    assert report_record(report) is None
    set_report_record(report, record)
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    wire = json.loads(json.dumps(data))  # what crosses the process boundary: JSON
    received = config.hook.pytest_report_from_serializable(config=config, data=wire)
    assert isinstance(received, pytest.TestReport)
    assert report_record(received) == record


def test_drop_removes_the_record_and_tolerates_none() -> None:
    report = _report()
    set_report_record(report, {"id": "x"})
    drop_report_record(report)
    assert report_record(report) is None
    drop_report_record(report)  # nothing attached: no error
    assert report_record(report) is None
