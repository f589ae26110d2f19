"""One way to load a profile's benchmark (core.builders.load_profile_benchmark), used by the
plugin (with the builder hook) and by ``memeval bench`` (bundled builders only)."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_memeval.core.benchmark import BenchmarkError, load_jsonl
from pytest_memeval.core.builders import build_bundled, load_profile_benchmark
from pytest_memeval.core.profiles import Profile, resolve_profile
from pytest_memeval.tools import bench

from ..conftest import REPO, demo_records, write_jsonl


def _profile(tmp_path: Path, benchmark: str) -> Profile:
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [tool.memeval.ckpt.mine]
            model = "{(REPO / "demo" / "checkpoint" / "base").as_posix()}"
            benchmark = {benchmark}
            """
        ),
        encoding="utf-8",
    )
    return resolve_profile("mine", tmp_path / "pyproject.toml")


def test_the_bundled_builder_gives_the_plugins_scenarios() -> None:
    profile = resolve_profile("oracle", REPO / "pyproject.toml")
    benchmark = load_profile_benchmark(profile)
    assert len(benchmark.scenarios) == 189
    assert benchmark.source == "builder 'scene_memory' (oracle)"
    # The same scenarios bench decodes (bundled builders only, no pytest session).
    args = argparse.Namespace(benchmark=None)
    assert bench._scenarios(args, profile) == list(benchmark.scenarios)


def test_a_jsonl_benchmark_is_read_as_a_file(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", demo_records("oracle", 3))
    profile = _profile(tmp_path, '"b.jsonl"')
    got = load_profile_benchmark(profile)
    assert got == load_jsonl(tmp_path / "b.jsonl")
    assert [s.id for s in got.scenarios] == [r["id"] for r in demo_records("oracle", 3)]


def test_the_lookup_decides_which_builders_exist(tmp_path: Path) -> None:
    profile = _profile(tmp_path, '{ builder = "mine", size = 2 }')
    calls: list[tuple[str, dict[str, Any], Path]] = []

    def lookup(
        builder: str, options: Mapping[str, Any], rootdir: Path
    ) -> Iterable[Mapping[str, Any]] | None:
        calls.append((builder, dict(options), rootdir))
        return demo_records("oracle", int(options["size"])) if builder == "mine" else None

    got = load_profile_benchmark(profile, lookup)
    assert calls == [("mine", {"size": 2}, tmp_path)]
    assert got.source == "builder 'mine' (mine)" and len(got.scenarios) == 2

    # The default lookup knows only the bundled builders: one error naming file and profile.
    with pytest.raises(BenchmarkError) as refused:
        load_profile_benchmark(profile)
    assert str(refused.value) == (
        f"{tmp_path / 'pyproject.toml'}: [tool.memeval.ckpt.mine]: no plugin implements "
        "benchmark builder 'mine'"
    )
    # bench says what to do instead.
    with pytest.raises(BenchmarkError, match=r"only pytest can run .*--benchmark FILE\.jsonl"):
        bench._scenarios(argparse.Namespace(benchmark=None), profile)


def test_a_bundled_builders_data_error_is_tagged_with_its_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(BenchmarkError, match=r"^builder 'scene_memory': .*nope\.jsonl"):
        build_bundled("scene_memory", {"tasks": str(missing)}, tmp_path)
    assert build_bundled("not-bundled", {}, tmp_path) is None
