"""Options written the way people type them, the profile handed to workers, start-up failures
that stop the run once, and sweeps that override a profile from the command line (issue 10.2,
10.5).

The end-to-end runs are real: pytester subprocesses in a project directory outside the repo,
profiles with absolute paths, the demo checkpoint, with and without xdist.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.profiles import (
    BenchmarkSpec,
    GenerationSettings,
    Profile,
    ProfileError,
    apply_overrides,
    profile_from_plain,
    profile_to_plain,
)
from pytest_memeval.model.checks import fingerprint_dir
from pytest_memeval.runtime.cmdline import SETUP_NOTE_KEY
from pytest_memeval.runtime.session import run_dir_name
from pytest_memeval.runtime.startup import (
    describe_load_failure,
    nothing_selected,
    parse_worker_error,
)

from ..conftest import ADAPTERS, BASE_MODEL, MemevalProject

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

N = 2  # scenarios per run: enough for two workers, small for a 2-core machine


def _spell(option: str, value: Path | str, spelling: str) -> list[str]:
    return [option, str(value)] if spelling == "space" else [f"{option}={value}"]


def _metrics(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "metrics.json").read_text("utf-8"))
    return data


# -- path options with a space or '=', -n 0 and -n 2, run directory outside and existing ------


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("spelling", ["space", "equals"])
def test_path_options_either_spelling_with_existing_dirs(
    memeval_project: MemevalProject,
    tmp_path_factory: pytest.TempPathFactory,
    spelling: str,
    workers: str,
) -> None:
    """``--memeval-out DIR`` / ``--memeval-expect FILE`` after a space: with DIR already there
    (a second run, or workers started after the controller made it) pytest used to take DIR
    for a test path and lose the project's pyproject (profiles, ini, addopts)."""
    memeval_project.write(n=N, ini='memeval_decode = "reference"')
    outside = tmp_path_factory.mktemp("results-disk")
    out = outside / "runs" / "x"
    out.mkdir(parents=True)  # exists already, as on a second run
    expect = outside / "known.txt"
    expect.write_text("# none known\n", "utf-8")
    result = memeval_project.run(
        "-n",
        workers,
        "--ckpt",
        "demo",
        *_spell("--memeval-out", out, spelling),
        *_spell("--memeval-expect", expect, spelling),
    )
    text = result.stdout.str() + result.stderr.str()
    assert "unknown --ckpt" not in text, text[-3000:]
    assert "node down" not in text and "replacing crashed worker" not in text, text[-3000:]
    assert f"rootdir: {memeval_project.path}" in text
    m = _metrics(out)
    assert m["complete"] is True and m["n"] == N, m["scope"]
    # The project's ini reached every process that decoded: the controller and the workers.
    assert m["decoding"]["path"] == "reference"
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert {r["decode"] for r in records} == {"reference"}
    if workers == "2":
        assert {r["worker"] for r in records} <= {"gw0", "gw1"}
    assert not (memeval_project.path / "runs").exists()  # nothing went to the default place


@pytest.mark.slow
@pytest.mark.parametrize(
    "option",
    [
        "--memeval-out",
        "--memeval-baseline",
        "--memeval-expect",
        "--memeval-model",
        "--memeval-adapter",
    ],
)
def test_every_path_option_keeps_the_projects_setup(
    memeval_project: MemevalProject, tmp_path_factory: pytest.TempPathFactory, option: str
) -> None:
    """pytest's first pass takes an existing value of any path option for a test path. Worst
    case: the value lies inside another project whose config file would win (here one with
    its own addopts and ini values). The plugin puts the setup back on the user's project."""
    memeval_project.write(n=N, ini='memeval_decode = "reference"\nmemeval_out = "results"')
    foreign = tmp_path_factory.mktemp("training-repo")
    (foreign / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "--maxfail=7"\nmemeval_out = "elsewhere"\n',
        "utf-8",
    )
    value = foreign / "out" / "checkpoint-500"
    value.mkdir(parents=True)
    config = memeval_project.pytester.parseconfig(option, str(value))
    assert config.rootpath == memeval_project.path
    assert config.inipath == memeval_project.path / "pyproject.toml"
    assert config.getini("memeval_decode") == "reference"
    assert config.getini("memeval_out") == "results"
    # The foreign addopts (--maxfail=7) did not apply: the default is 0, None from pytest 9.2.
    assert config.getoption("maxfail") in (0, None)
    assert not config.pluginmanager.has_plugin("cacheprovider")  # the project's did
    assert config.args == [str(memeval_project.path)]  # the value is no test path
    assert str(value) in (config.stash.get(SETUP_NOTE_KEY, None) or "")
    # Written with '=' nothing needed correcting.
    config = memeval_project.pytester.parseconfig(f"{option}={value}")
    assert config.rootpath == memeval_project.path
    assert config.stash.get(SETUP_NOTE_KEY, None) is None


@pytest.mark.slow
def test_uncorrectable_setup_is_one_clear_usage_error(
    memeval_project: MemevalProject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A wrong config file whose addopts load or block plugins (``-p``) cannot be undone once
    pytest applied it: say what happened and how to write the option instead."""
    memeval_project.write(n=N)
    foreign = tmp_path_factory.mktemp("other-repo")
    (foreign / "pytest.ini").write_text("[pytest]\naddopts = -p no:xdist\n", "utf-8")
    with pytest.raises(pytest.UsageError) as info:
        memeval_project.pytester.parseconfig("--memeval-out", str(foreign))
    message = str(info.value)
    assert f"pytest took {foreign} for a test path" in message
    assert "-p no:xdist" in message and "--memeval-out=DIR" in message


@pytest.mark.slow
def test_space_spelling_from_a_subdirectory_second_run(
    memeval_project: MemevalProject,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From a subdirectory of the project, twice into the same outside run directory, -n 2."""
    memeval_project.write(n=N)
    out = tmp_path_factory.mktemp("disk") / "run"
    sub = memeval_project.path / "evals"
    sub.mkdir()
    shutil.move(str(memeval_project.path / "test_eval.py"), sub / "test_eval.py")
    monkeypatch.chdir(sub)
    for attempt in range(2):
        result = memeval_project.run("-n", "2", "--ckpt", "demo", "--memeval-out", str(out))
        text = result.stdout.str() + result.stderr.str()
        assert f"rootdir: {memeval_project.path}" in text, (attempt, text[-3000:])
        m = _metrics(out)
        assert m["complete"] is True and m["n"] == N, (attempt, m["scope"])
    assert "memeval: corrected pytest's setup" in text  # the second run needed the fix


# -- a worker or a model that cannot start stops the run once --------------------------------


def _cuda_builtin() -> bool:
    import torch

    return torch.version.cuda is not None


@pytest.mark.slow
@pytest.mark.skipif(_cuda_builtin(), reason="needs a torch build without CUDA")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_gpus_on_cpu_torch_stops_once(
    memeval_project: MemevalProject, tmp_path_factory: pytest.TempPathFactory, workers: str
) -> None:
    memeval_project.write(n=N)
    out = tmp_path_factory.mktemp("disk") / "run"
    out.mkdir()
    earlier = '{"earlier": "run"}\n'
    (out / "metrics.json").write_text(earlier, "utf-8")
    gpus = "0,1" if workers == "2" else "0"
    result = memeval_project.run(
        "-n", workers, "--ckpt", "demo", "--memeval-out", str(out), "--memeval-gpus", gpus
    )
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, text[-3000:]
    assert text.count("this torch build has no CUDA support") == 1, text[-3000:]
    assert "--memeval-gpus cpu" in text
    assert "Torch not compiled with CUDA enabled" not in text
    assert "node down" not in text and "replacing crashed worker" not in text
    assert "INCOMPLETE" not in text and " error" not in text.lower().replace("error:", "")
    assert (out / "metrics.json").read_text("utf-8") == earlier  # nothing replaced
    assert not (out / "predictions.jsonl").exists()


@pytest.mark.slow
@pytest.mark.skipif(_cuda_builtin(), reason="needs a torch build without CUDA")
def test_no_model_load_when_no_eval_item_is_selected(memeval_project: MemevalProject) -> None:
    """The model is loaded once eval items are selected: a path without eval items runs
    what it names; -k deselecting every eval item stops with that one line, loading nothing
    (this torch has no CUDA: a load on GPUs 0,1 would fail)."""
    memeval_project.write(n=N)
    memeval_project.pytester.makepyfile(test_other="def test_other():\n    pass\n")
    gpus = ("-n", "2", "--ckpt", "demo", "--memeval-gpus", "0,1")
    result = memeval_project.run(*gpus, "test_other.py")
    assert result.ret == 0, result.stdout.str()[-3000:] + result.stderr.str()
    result.stdout.fnmatch_lines(["*1 passed*"])
    result = memeval_project.run(*gpus, "-k", "test_other")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text[-3000:]
    assert text.count(nothing_selected("demo", 2 * N)) == 1, text[-3000:]
    assert "no CUDA support" not in text and "Torch not compiled" not in text


@pytest.mark.slow
def test_broken_weight_file_stops_once(
    memeval_project: MemevalProject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    broken = tmp_path_factory.mktemp("models") / "base"
    shutil.copytree(BASE_MODEL, broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])  # an incomplete copy
    memeval_project.write(
        n=N,
        profiles=f"""
        [tool.memeval.ckpt.broken]
        model = "{broken.as_posix()}"
        benchmark = "bench.jsonl"
        """,
    )
    result = memeval_project.run("-n", "2", "--ckpt", "broken")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, text[-3000:]
    assert text.count("could not load model") == 1, text[-3000:]
    assert "a checkpoint file could not be read" in text and str(broken) in text
    assert "node down" not in text and "replacing crashed worker" not in text
    assert not (memeval_project.run_dir("broken") / "metrics.json").exists()


@pytest.mark.slow
def test_worker_start_up_error_stops_with_its_own_message(
    memeval_project: MemevalProject,
) -> None:
    """Any worker that fails at start-up (here a conftest of the user's) stops the run at
    once with that worker's message, instead of xdist replacing it again and again."""
    memeval_project.write(n=N)
    memeval_project.pytester.makeconftest(
        """
        import pytest

        def pytest_configure(config):
            if hasattr(config, "workerinput"):
                raise pytest.UsageError("no scratch space on this node (worker-only check)")
        """
    )
    result = memeval_project.run("-n", "2", "--ckpt", "demo")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, text[-3000:]
    assert text.count("no scratch space on this node") == 1, text[-3000:]
    assert "failed to start" in text
    assert "replacing crashed worker" not in text and "INCOMPLETE" not in text
    assert not (memeval_project.run_dir() / "metrics.json").exists()


@pytest.mark.slow
def test_missing_adapter_override_is_a_usage_error(memeval_project: MemevalProject) -> None:
    memeval_project.write(n=N)
    missing = memeval_project.path / "train" / "checkpoint-500"
    result = memeval_project.run("-n", "2", "--ckpt", "demo", "--memeval-adapter", str(missing))
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4
    assert f"adapter directory not found: {missing}" in text
    assert text.count("adapter directory not found") == 1


# -- sweeps: --memeval-adapter / --memeval-model / --memeval-set -----------------------------


@pytest.mark.slow
def test_adapter_override_changes_run_dir_and_fingerprint(
    memeval_project: MemevalProject,
) -> None:
    memeval_project.write(n=N)
    other = ADAPTERS / "baseline"
    result = memeval_project.run(
        "-n",
        "2",
        "--ckpt",
        "demo",
        "--memeval-adapter",
        str(other),
        "--memeval-set",
        "generation.max_new_tokens=1",
    )
    text = result.stdout.str() + result.stderr.str()
    overrides = {
        "adapter": {"value": str(other), "profile": str(ADAPTERS / "oracle")},
        "generation.max_new_tokens": {"value": "1", "profile": "16"},
    }
    run_dir = memeval_project.path / "runs" / run_dir_name("demo", overrides)
    assert run_dir.name.startswith("demo@baseline-") and run_dir.name.endswith("@max_new_tokens-1")
    m = _metrics(run_dir)
    assert m["overrides"] == overrides
    assert m["fingerprints"]["adapter"] == fingerprint_dir(other)
    assert m["fingerprints"]["adapter"] != fingerprint_dir(ADAPTERS / "oracle")
    assert m["decoding"]["max_new_tokens"] == 1
    # The workers decoded with the overridden settings: one token never ends an answer.
    assert m["parse_fail"]["final"] == N
    assert "overridden on the command line: adapter" in text
    # The adapter directory (inside this repo, below its pyproject.toml) was taken for a test
    # path by pytest's first pass; the plugin put the rootdir back on the project.
    assert f"rootdir: {memeval_project.path}" in text
    assert "memeval: corrected pytest's setup" in text
    assert not memeval_project.run_dir("demo").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("generation.temperature=0.7", "unknown key 'generation.temperature'"),
        ("generation.dtype=bf16", "generation.dtype must be float32, bfloat16 or float16"),
        ("generation.max_new_tokens=many", "'many' is not a positive integer"),
        ("generation.max_new_tokens=0", "max_new_tokens must be a positive integer"),
        ("dtype", "expected KEY=VALUE"),
    ],
)
def test_bad_set_is_a_usage_error_naming_it(
    memeval_project: MemevalProject, setting: str, named: str
) -> None:
    memeval_project.write(n=N)
    result = memeval_project.run("--ckpt", "demo", "--memeval-set", setting)
    text = result.stderr.str()
    assert result.ret == 4, text
    assert named in text and "--memeval-set" in text


# -- units -------------------------------------------------------------------------------------


def _profile(**kw: Any) -> Profile:
    base: dict[str, Any] = {
        "name": "p",
        "kind": "model",
        "benchmark": BenchmarkSpec(path=Path("/b.jsonl")),
        "source": Path("/proj/pyproject.toml"),
        "model": Path("/m"),
        "adapter": Path("/a"),
    }
    base.update(kw)
    return Profile(**base)


def test_apply_overrides_records_old_and_new() -> None:
    p, over = apply_overrides(
        _profile(),
        adapter=Path("/ckpt/checkpoint-500"),
        settings=["generation.dtype=bfloat16", "generation.attn_implementation = sdpa"],
    )
    assert p.adapter == Path("/ckpt/checkpoint-500") and p.model == Path("/m")
    assert p.generation == GenerationSettings(32, "bfloat16", "sdpa")
    assert over == {
        "adapter": {"value": "/ckpt/checkpoint-500", "profile": "/a"},
        "generation.dtype": {"value": "bfloat16", "profile": "float32"},
        "generation.attn_implementation": {"value": "sdpa", "profile": "eager"},
    }
    same, none = apply_overrides(_profile())
    assert same == _profile() and none == {}


def test_overrides_refused_for_replay_profiles() -> None:
    replay = _profile(kind="replay", model=None, adapter=None, predictions=Path("/p.jsonl"))
    with pytest.raises(ProfileError, match="--memeval-adapter: --ckpt p is a replay profile"):
        apply_overrides(replay, adapter=Path("/x"))


def test_run_dir_names_keep_same_named_adapters_apart() -> None:
    a = {"adapter": {"value": "/run-a/checkpoint-500", "profile": None}}
    b = {"adapter": {"value": "/run-b/checkpoint-500", "profile": None}}
    assert run_dir_name("oracle", {}) == "oracle"
    assert run_dir_name("oracle", a).startswith("oracle@checkpoint-500-")
    assert run_dir_name("oracle", a) != run_dir_name("oracle", b)
    both = {
        "model": {"value": "/models/base v2", "profile": "/m"},
        "generation.dtype": {"value": "bfloat16", "profile": "float32"},
    }
    name = run_dir_name("oracle", both)
    assert name.startswith("oracle@model-base v2-") and name.endswith("@dtype-bfloat16")


def test_profile_plain_round_trip_is_json() -> None:
    p = _profile(benchmark=BenchmarkSpec(builder="scene_memory", options={"tasks": "t.jsonl"}))
    data = json.loads(json.dumps(profile_to_plain(p)))
    assert profile_from_plain(data) == p


def test_parse_worker_error_takes_the_workers_own_message() -> None:
    ours = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "x.py", line 1, in <module>
        pytest.UsageError: pytest-memeval: worker gw0 could not load
        model /m on cuda:0: out of memory"""
    )
    assert parse_worker_error(ours) == (
        4,
        "pytest-memeval: worker gw0 could not load\nmodel /m on cuda:0: out of memory",
    )
    internal = ours.replace("UsageError: ", "UsageError: [internal error] ")
    assert parse_worker_error(internal) == (
        3,
        "pytest-memeval: worker gw0 could not load\nmodel /m on cuda:0: out of memory",
    )
    generic = 'Traceback (most recent call last):\n  File "c.py"\npytest.UsageError: bad ini'
    assert parse_worker_error(generic) == (4, "bad ini")
    crash = 'Traceback (most recent call last):\n  File "c.py"\nImportError: no module x'
    assert parse_worker_error(crash) == (3, "ImportError: no module x")


def test_load_failures_are_classified_with_advice() -> None:
    def describe(exc: BaseException, device: str = "cuda:0 (physical 1)") -> tuple[int, str]:
        return describe_load_failure(exc, where="worker gw1", what="model /m", device=device)

    status, msg = describe(AssertionError("Torch not compiled with CUDA enabled"))
    assert status == 4 and "--memeval-gpus cpu" in msg and "worker gw1" in msg
    status, msg = describe(RuntimeError("CUDA error: invalid device ordinal"))
    assert status == 4 and "nvidia-smi -L" in msg
    status, msg = describe(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert status == 4 and "--memeval-workers-per-gpu" in msg
    status, msg = describe(OSError("Error while deserializing header"), device="cpu")
    assert status == 4 and "broken" in msg
    status, msg = describe(TypeError("unexpected keyword 'x'"), device="cpu")
    assert status == 3 and "internal error" in msg
