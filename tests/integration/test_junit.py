"""JUnit XML that dashboards can use, under ``-n 0`` and ``-n 2``: each eval item's scenario,
prediction and truth as ``<testcase>`` properties where the family allows them, the run's
numbers as ``<testsuite>`` properties written by the controller after pytest wrote the file.

Read back by parsing the file pytest wrote; validated against the xunit2 schema pytest's own
tests use (tests/junitschema.py). Model-free projects (a replay profile over crafted,
hostile predictions), plus one real demo-model run under xdist.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import xmlschema

from ..conftest import MemevalProject, demo_records
from ..junitschema import junit_xsd
from ..markdown import HOSTILE
from ..runfactory import read_jsonl, write_crafted

N = 6
#: final answers that test the XML escaping: markup, quotes, newlines, a control character
TEXTS = ["<script>alert('x')</script>", 'a "quoted" & <b>', "one\ntwo\r\nthree", HOSTILE[0]]


@pytest.fixture(scope="session")
def xsd() -> xmlschema.XMLSchema:
    path = junit_xsd()
    if path is None:
        message = "pytest's junit-10.xsd could not be downloaded (pip download pytest sdist)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return xmlschema.XMLSchema(str(path))


@pytest.fixture
def crafted(memeval_project: MemevalProject) -> tuple[MemevalProject, list[dict[str, Any]]]:
    """6 demo scenarios replayed: the first four final answers are TEXTS (wrong), the fifth
    scenario has a wrong first turn."""
    recs = demo_records("baseline", N)
    write_crafted(
        memeval_project,
        recs,
        final_text=dict(zip([r["id"] for r in recs[:4]], TEXTS, strict=True)),
        wrong_turn=[recs[4]["id"]],
    )
    return memeval_project, recs


def _props(node: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in node.findall("properties/property")}


def _cases(root: ET.Element) -> dict[str, dict[str, str]]:
    return {case.get("name", ""): _props(case) for case in root.iter("testcase")}


def _suite_expected(metrics: dict[str, Any], run_dir: Path) -> dict[str, str]:
    m1, m2 = metrics["m1"], metrics["m2"]
    expected = {
        "memeval.ckpt": "crafted",
        "memeval.run_dir": str(run_dir),
        "memeval.complete": "true",
        "memeval.n": str(N),
        "memeval.missing": "0",
        "memeval.m1": f"{m1['rate']:.6f}",
        "memeval.m1.correct": str(m1["correct"]),
        "memeval.m1.total": str(m1["total"]),
        "memeval.m1.ci95_low": f"{m1['ci95'][0]:.6f}",
        "memeval.m1.ci95_high": f"{m1['ci95'][1]:.6f}",
        "memeval.m1.ci95_method": "wilson",
        "memeval.m2": f"{m2['rate']:.6f}",
        "memeval.m2.ci95_low": f"{m2['ci95'][0]:.6f}",
        "memeval.m2.ci95_high": f"{m2['ci95'][1]:.6f}",
        "memeval.unaligned": "0",
        "memeval.decode": "replay",
    }
    for part, value in metrics["fingerprints"].items():
        expected[f"memeval.fingerprint.{part}"] = str(value)
    return expected


@pytest.mark.parametrize(
    ("workers", "family"),
    [
        ([], "xunit1"),
        pytest.param(["-n", "2"], "xunit1", marks=pytest.mark.slow),
        pytest.param(["-n", "2"], "legacy", marks=pytest.mark.slow),
    ],
    ids=["n0-xunit1", "n2-xunit1", "n2-legacy"],
)
@pytest.mark.slow
def test_xunit1_testcases_carry_scenario_prediction_and_truth(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], workers: list[str], family: str
) -> None:
    project, recs = crafted
    result = project.run(
        *workers, "--ckpt", "crafted", "--junitxml", "out/junit.xml", "-o", f"junit_family={family}"
    )
    path = project.path / "out" / "junit.xml"
    result.stdout.fnmatch_lines([f"*memeval: run properties added to the JUnit XML {path}*"])
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite[0].tag == "properties"  # first, as the schema wants
    metrics = project.metrics("crafted")
    props = _props(suite)
    assert {k: props[k] for k in _suite_expected(metrics, project.run_dir("crafted"))} == (
        _suite_expected(metrics, project.run_dir("crafted"))
    )
    cases = _cases(root)
    assert len(cases) == 2 * N  # every eval item, each once
    for i, rec in enumerate(recs):
        final = cases[f"test_final_query[{rec['id']}]"]
        assert final["memeval.scenario"] == rec["id"]
        truth = rec["messages"][-1]["content"]
        assert final["memeval.truth"] == truth
        # The prediction as the model wrote it: markup, quotes, newlines survive the XML.
        assert final["memeval.prediction"] == (TEXTS[i] if i < 4 else truth)
        assert final["memeval.match"] == ("false" if i < 4 else "true")
        turns = cases[f"test_turns[{rec['id']}]"]
        assert turns["memeval.scenario"] == rec["id"]
        n_turns = len(rec["memory_chain"])
        if i == 4:
            assert turns["memeval.turns"] == f"{n_turns - 1}/{n_turns}"
            assert (turns["memeval.turn"], turns["memeval.prediction"]) == (
                "0",
                "look around the room",
            )
            assert turns["memeval.truth"] == rec["memory_chain"][0]
        else:
            assert turns["memeval.turns"] == f"{n_turns}/{n_turns}"
            assert "memeval.prediction" not in turns


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.slow)], ids=["n0", "n2"]
)
def test_xunit2_default_validates_against_pytests_schema(
    crafted: tuple[MemevalProject, list[dict[str, Any]]],
    xsd: xmlschema.XMLSchema,
    workers: list[str],
) -> None:
    project, _ = crafted
    project.run(*workers, "--ckpt", "crafted", "--junitxml=junit.xml")
    path = project.path / "junit.xml"
    xsd.validate(str(path))  # raises with the reason if the file breaks the schema
    root = ET.parse(path).getroot()
    assert all(not props for props in _cases(root).values())  # none: the schema forbids them
    suite = root.find("testsuite")
    assert suite is not None
    assert _props(suite)["memeval.m1"] == f"{project.metrics('crafted')['m1']['rate']:.6f}"


@pytest.mark.slow
def test_testcase_properties_under_xunit2_on_request(
    crafted: tuple[MemevalProject, list[dict[str, Any]]], xsd: xmlschema.XMLSchema
) -> None:
    project, recs = crafted
    path = project.path / "junit.xml"
    # On request, under xunit2 too (-n 2: the workers add them): outside its schema, which
    # is why it is a request.
    project.run(
        "-n",
        "2",
        "--ckpt",
        "crafted",
        "--junitxml=junit.xml",
        "--memeval-junit-testcase-properties=always",
    )
    cases = _cases(ET.parse(path).getroot())
    assert cases[f"test_final_query[{recs[0]['id']}]"]["memeval.prediction"] == TEXTS[0]
    assert not xsd.is_valid(str(path))


@pytest.mark.slow
def test_without_junitxml_nothing_is_added(
    crafted: tuple[MemevalProject, list[dict[str, Any]]],
) -> None:
    project, _ = crafted
    result = project.run("--ckpt", "crafted", "-o", "junit_family=xunit1")
    assert "JUnit" not in result.stdout.str()
    assert not list(project.path.glob("*.xml"))


@pytest.mark.slow
def test_real_model_under_xdist_and_its_warnings(memeval_project: MemevalProject) -> None:
    """The demo model under -n 2: JUnit properties are its real predictions; the warnings
    summary keeps the user's own warning and drops transformers' is_gradient_checkpointing
    notice (which peft triggers while loading the adapter: nothing a user can act on)."""
    memeval_project.write(variant="oracle", n=3)
    (memeval_project.path / "test_mine.py").write_text(
        "import warnings\n\n\n"
        "def test_mine():\n"
        "    warnings.warn(FutureWarning('my_helper is deprecated'))\n",
        "utf-8",
    )
    result = memeval_project.run(
        "-n", "2", "--ckpt", "demo", "--junitxml", "junit.xml", "-o", "junit_family=xunit1"
    )
    out = result.stdout.str()
    assert "my_helper is deprecated" in out  # other warnings stay
    assert "is_gradient_checkpointing" not in out  # the third-party noise is gone
    root = ET.parse(memeval_project.path / "junit.xml").getroot()
    cases = _cases(root)
    predictions = read_jsonl(memeval_project.run_dir("demo") / "predictions.jsonl")
    assert len(predictions) == 3
    for rec in predictions:
        final = cases[f"test_final_query[{rec['id']}]"]
        assert final["memeval.prediction"] == rec["final_pred"]
        assert final["memeval.match"] == json.dumps(rec["final_match"])
    suite = root.find("testsuite")
    assert suite is not None
    metrics = memeval_project.metrics("demo")
    assert _props(suite)["memeval.m1.correct"] == str(metrics["m1"]["correct"])
    assert _props(suite)["memeval.fingerprint.adapter"] == metrics["fingerprints"]["adapter"]
