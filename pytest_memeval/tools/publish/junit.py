"""JUnit XML that dashboards can use: each eval item's scenario, prediction and truth, and
the run's numbers on the test suite, under ``-n 0`` and ``-n 8`` alike.

**Test case properties** (``memeval.scenario``, ``memeval.prediction``, ``memeval.truth``,
...; :func:`case_properties`) are added where the item runs (an xdist worker too) to the
item's ``user_properties``, pytest's documented carrier, which travels to the controller on
the test report and which pytest's junitxml writes as ``<properties>`` of the ``<testcase>``.
The xunit1 schema (``-o junit_family=xunit1`` or ``legacy``) allows them there; the default
xunit2 schema does not (pytest's ``record_property`` warns for the same reason), so under
xunit2 they are written only on request: ``--memeval-junit-testcase-properties always`` (ini
``memeval_junit_testcase_properties``; Jenkins' junit plugin and most readers accept them, a
strict validator will not). ``never`` turns them off.

**Test suite properties** (``memeval.m1``, its interval, ``memeval.complete``, the
fingerprints, ...; :func:`suite_properties`) are valid in every family. pytest's
``record_testsuite_property`` cannot carry them: it does not work under xdist (pytest#7767),
and the numbers exist only once the run is written, after pytest's own session-finish hooks.
So the controller adds them to the file pytest wrote, as a ``pytest_memeval_run_finished``
implementation (after junitxml wrote it, tools/publish/finished.py): parsed, the properties appended
to the ``<testsuite>``'s ``<properties>`` (created as its first child, where the schema wants
it), written back atomically (a temporary sibling renamed over the file).

PYTEST_DONT_REWRITE: a plugin module without test code (see plugin.py).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_memeval.compat.pytest import junit_file, report_record
from pytest_memeval.core.history import history_of
from pytest_memeval.core.records import Metrics, Record
from pytest_memeval.core.rundir import atomic_write
from pytest_memeval.runtime.eval_items import scenario_param
from pytest_memeval.runtime.state import STATE_KEY
from pytest_memeval.runtime.worker import RECORD_KEY
from pytest_memeval.tools.publish.finished import FinishedRun, report_output

__all__ = [
    "MODES",
    "VALUE_LIMIT",
    "add_suite_properties",
    "case_properties",
    "case_properties_wanted",
    "episode_suite_properties",
    "suite_properties",
]

#: --memeval-junit-testcase-properties: auto (where the JUnit family allows them), always, never
MODES = ("auto", "always", "never")
#: The most characters of one model or benchmark text a property holds (JUnit files are
#: ingested whole; GitLab refuses files over 30 MB, Jenkins keeps every property)
VALUE_LIMIT = 1000
#: characters XML 1.0 cannot hold at all, even escaped
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memeval")
    group.addoption(
        "--memeval-junit-testcase-properties",
        dest="memeval_junit_testcase_properties",
        choices=MODES,
        default=None,
        help="with --junitxml: each eval item's scenario, prediction and truth as <testcase> "
        "properties: auto (default: with junit_family xunit1 or legacy, whose schema allows "
        "them), always (under xunit2 too, outside its schema), never. Default: "
        "memeval_junit_testcase_properties ini.",
    )
    parser.addini(
        "memeval_junit_testcase_properties",
        "eval items' JUnit <testcase> properties: auto, always or never",
        default="auto",
    )


def case_properties_wanted(config: pytest.Config) -> bool:
    """Whether eval items carry their JUnit properties in this session (public options and
    ini values only: the same answer on the controller and on every xdist worker)."""
    if not config.getoption("xmlpath", None):
        return False
    mode = config.getoption("memeval_junit_testcase_properties", None) or config.getini(
        "memeval_junit_testcase_properties"
    )
    if mode not in MODES:
        raise pytest.UsageError(
            f"memeval_junit_testcase_properties = {mode!r}: use one of {', '.join(MODES)}"
        )
    if mode != "auto":
        return bool(mode == "always")
    return config.getini("junit_family") in ("xunit1", "legacy")


def _cut(text: str) -> str:
    if len(text) <= VALUE_LIMIT:
        return text
    return f"{text[:VALUE_LIMIT]}… (+{len(text) - VALUE_LIMIT} characters)"


def case_properties(kind: str, record: Record) -> list[tuple[str, str]]:
    """The ``<testcase>`` properties of an eval item over ``record``.

    ``test_turns``: the scenario, ``memeval.turns`` (``right/scored``, or why none is
    scored) and, for the first wrong aligned turn, its index, prediction and truth. Any other
    eval item (``test_final_query``): the scenario, the final prediction and truth,
    ``memeval.match`` and the parse failure's reason when there is one. Text is cut at
    :data:`VALUE_LIMIT` characters.
    """
    props = [("memeval.scenario", record["id"])]
    if kind == "test_turns":
        turns = record["turns"]
        if not record["aligned"]:
            return [*props, ("memeval.turns", f"unaligned: {len(turns)} turns, not scored")]
        scored = [t for t in turns if t["match"] is not None]
        right = sum(t["match"] is True for t in scored)
        props.append(("memeval.turns", f"{right}/{len(scored)}"))
        wrong = next((t for t in scored if t["match"] is False), None)
        if wrong is not None:
            props += [
                ("memeval.turn", str(wrong["index"])),
                ("memeval.prediction", _cut(wrong["pred"])),
                ("memeval.truth", _cut(str(wrong["gt"]))),
            ]
        return props
    props += [
        ("memeval.prediction", _cut(record["final_pred"])),
        ("memeval.truth", _cut(record["final_gt"])),
        ("memeval.match", "true" if record["final_match"] else "false"),
    ]
    if record.get("parse_fail"):
        props.append(("memeval.parse_fail", str(record.get("parse_fail_reason") or "yes")))
    return props


class JunitTestcaseProperties:
    """Registered where eval items run (each xdist worker, or the one process) when
    :func:`case_properties_wanted`."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        if report.when != "call" or scenario_param(item) is None:
            return
        # The worker moves the record onto the call report (worker.py); which wrapper runs
        # first is not ours to fix, so look in both places (as report/plugin.py does).
        record = report_record(report) or item.stash.get(RECORD_KEY, None)
        if not isinstance(record, dict):
            return
        # junitxml reads the teardown report's user_properties, copied from the item's.
        kind = getattr(item, "originalname", item.name)
        item.user_properties.extend(case_properties(kind, cast(Record, record)))


# -- the test suite's properties (controller) --------------------------------------------------


def _num(value: object) -> str:
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def _num_or_na(value: float | None) -> str:
    return "n/a" if value is None else _num(value)


def episode_suite_properties(run: FinishedRun) -> list[tuple[str, str]]:
    """The ``<testsuite>`` properties of an episode run: what it ran, the success rate with
    its 95% interval, the mean score, steps, invalid actions, each termination reason,
    completeness and the fingerprints (``memeval.success_rate``, ``memeval.success.ci95_low``,
    ``memeval.reason.step_limit``, ...)."""
    m = run.episodes
    if m is None:
        raise ValueError(f"{run.run_dir}: not an episode run")
    numbers, success = m["episodes"], m["episodes"]["success"]
    props = [
        ("memeval.ckpt", run.ckpt),
        ("memeval.run_dir", str(run.run_dir)),
        ("memeval.kind", "episodes"),
        ("memeval.complete", "true" if run.complete else "false"),
        ("memeval.episodes", str(numbers["episodes"])),
        ("memeval.missing", str(len(m["missing"]))),
        ("memeval.errors", str(numbers["errors"])),
        ("memeval.success_rate", _num_or_na(success["rate"])),
        ("memeval.success.correct", str(success["correct"])),
        ("memeval.success.total", str(success["total"])),
    ]
    ci = success.get("ci95")
    if ci:
        props += [
            ("memeval.success.ci95_low", _num(float(ci[0]))),
            ("memeval.success.ci95_high", _num(float(ci[1]))),
            ("memeval.success.ci95_method", str(success.get("ci95_method"))),
        ]
    invalid = numbers["invalid_actions"]
    props += [
        ("memeval.mean_score", _num_or_na(numbers["mean_score"])),
        ("memeval.steps", str(numbers["steps"]["total"])),
        ("memeval.steps.mean", _num_or_na(numbers["steps"]["mean"])),
        ("memeval.invalid_actions", str(invalid["invalid"])),
        ("memeval.invalid_actions.judged", str(invalid["judged"])),
        ("memeval.invalid_actions.rate", _num_or_na(invalid["rate"])),
        ("memeval.truncated_outputs", str(numbers["truncated_outputs"])),
    ]
    props += [(f"memeval.reason.{k}", str(v)) for k, v in sorted(numbers["reasons"].items())]
    for part, value in sorted((m.get("fingerprints") or {}).items()):
        props.append((f"memeval.fingerprint.{part}", str(value)))
    return props


def suite_properties(run: FinishedRun) -> list[tuple[str, str]]:
    """The ``<testsuite>`` properties of a finished session's run: what it evaluated, m1 and
    m2 with their 95% intervals, completeness, the fingerprints and the gate's verdict (of an
    episode run: :func:`episode_suite_properties`)."""
    if run.episodes is not None:
        return episode_suite_properties(run)
    m: Metrics = run.metrics
    props = [
        ("memeval.ckpt", run.ckpt),
        ("memeval.run_dir", str(run.run_dir)),
        ("memeval.complete", "true" if run.complete else "false"),
        ("memeval.n", str(m["n"])),
        ("memeval.missing", str(len(m.get("missing") or []))),
    ]
    for name in ("m1", "m2"):
        block = m[name]
        props += [
            (f"memeval.{name}", _num(block["rate"]) if block["rate"] is not None else "n/a"),
            (f"memeval.{name}.correct", str(block["correct"])),
            (f"memeval.{name}.total", str(block["total"])),
        ]
        ci = block.get("ci95")
        if ci:
            props += [
                (f"memeval.{name}.ci95_low", _num(float(ci[0]))),
                (f"memeval.{name}.ci95_high", _num(float(ci[1]))),
                (f"memeval.{name}.ci95_method", str(block.get("ci95_method"))),
            ]
    props += [
        ("memeval.unaligned", str(m["unaligned"])),
        ("memeval.parse_fail.final", str(m["parse_fail"]["final"])),
        ("memeval.parse_fail.turns", str(m["parse_fail"]["turns"])),
        ("memeval.decode", str((m.get("decoding") or {}).get("path"))),
        ("memeval.history", history_of(m)),
    ]
    for part, value in sorted((m.get("fingerprints") or {}).items()):
        props.append((f"memeval.fingerprint.{part}", str(value)))
    if run.gate is not None and run.gate.checks:
        props.append(("memeval.gate", "passed" if run.gate.passed else "failed"))
        failed = [c.detail for c in run.gate.checks if not c.passed]
        if failed:
            props.append(("memeval.gate.failed", "; ".join(failed)))
    return props


def add_suite_properties(path: Path, properties: list[tuple[str, str]]) -> int:
    """Append ``properties`` to every ``<testsuite>`` of the JUnit file at ``path`` and write
    it back atomically; return how many test suites got them (pytest writes one)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        node = suite.find("properties")
        if node is None:
            node = ET.Element("properties")
            suite.insert(0, node)  # the schema's order: properties, then the test cases
        for name, value in properties:
            ET.SubElement(node, "property", name=name, value=_NOT_XML.sub("\ufffd", value))
    # The declaration as pytest writes it (ET.tostring's own would name the encoding in
    # single quotes, and "unicode" gives none).
    text = '<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root, encoding="unicode")
    atomic_write(path, [text])
    return len(suites)


def pytest_memeval_run_finished(config: pytest.Config, run: FinishedRun) -> None:
    target = junit_file(config)
    if target is None:
        return
    try:
        count = add_suite_properties(target.path, suite_properties(run))
    except (OSError, ET.ParseError) as exc:
        report_output(
            config,
            f"memeval: could not add the run's properties to the JUnit XML {target.path}: {exc}",
            problem=True,
        )
        return
    if count:
        report_output(config, f"memeval: run properties added to the JUnit XML {target.path}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if STATE_KEY in config.stash and case_properties_wanted(config):
        config.pluginmanager.register(JunitTestcaseProperties(), "memeval-junit-testcase")
