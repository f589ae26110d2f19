"""The cache directory: where it is, and entries produced once (core/cache.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_memeval.core.cache import cache_entry, produce_once, resolve_cache_dir


def test_the_first_setting_that_is_set_wins(tmp_path: Path) -> None:
    env = {"MEMEVAL_CACHE_DIR": str(tmp_path / "env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert resolve_cache_dir(tmp_path / "opt", env) == tmp_path / "opt"
    assert resolve_cache_dir(None, env) == tmp_path / "env"
    del env["MEMEVAL_CACHE_DIR"]
    assert resolve_cache_dir(None, env) == tmp_path / "xdg" / "pytest-memeval"
    assert resolve_cache_dir(None, {}) == Path.home() / ".cache" / "pytest-memeval"
    # Empty values are unset, as shells leave them.
    assert resolve_cache_dir(None, {"MEMEVAL_CACHE_DIR": "", "XDG_CACHE_HOME": ""}) == (
        Path.home() / ".cache" / "pytest-memeval"
    )


def test_a_relative_environment_value_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_cache_dir(None, {"MEMEVAL_CACHE_DIR": "c"}) == tmp_path / "c"
    assert resolve_cache_dir(None, {"MEMEVAL_CACHE_DIR": "~/x"}) == Path.home() / "x"


def test_entries_live_in_one_folder_per_kind(tmp_path: Path) -> None:
    assert cache_entry(tmp_path, "gguf", "ab12") == tmp_path / "gguf" / "ab12"
    assert cache_entry(tmp_path, "downloads", "pkg-1.0") == tmp_path / "downloads" / "pkg-1.0"
    with pytest.raises(ValueError, match="unknown cache kind 'models'"):
        cache_entry(tmp_path, "models", "x")
    for bad in ("", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="plain, visible file name"):
            cache_entry(tmp_path, "gguf", bad)


def _build_slowly(log: str, tmp: Path) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()}\n")
    tmp.mkdir()
    (tmp / "part1").write_text("1")
    time.sleep(0.5)  # long enough for the other processes to find the lock held
    (tmp / "part2").write_text("2")


def _produce(target: str, log: str, results: multiprocessing.Queue[tuple[bool, bool]]) -> None:
    made = produce_once(Path(target), lambda tmp: _build_slowly(log, tmp))
    # Whoever returns sees the whole entry, never half of it.
    whole = (Path(target) / "part1").is_file() and (Path(target) / "part2").is_file()
    results.put((made, whole))


def test_concurrent_producers_build_once_and_all_see_the_whole_entry(tmp_path: Path) -> None:
    target, log = tmp_path / "gguf" / "entry", tmp_path / "builds.log"
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[tuple[bool, bool]] = ctx.Queue()
    procs = [ctx.Process(target=_produce, args=(str(target), str(log), results)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in procs]
    assert sorted(made for made, _ in outcomes) == [False, False, False, True]
    assert all(whole for _, whole in outcomes)
    assert len(log.read_text().splitlines()) == 1  # one build, by one process
    assert sorted(p.name for p in target.parent.iterdir()) == ["entry", "entry.lock"]


#: A second producer in a process of its own (a fresh interpreter: a forked child would
#: share this process's lock, as flock locks belong to the open file, which fork copies).
WAITER = """
import sys
from pathlib import Path
from pytest_memeval.core.cache import produce_once
target, told = Path(sys.argv[1]), Path(sys.argv[2])
made = produce_once(target, lambda tmp: tmp.mkdir(), on_wait=lambda: told.write_text("waiting"))
sys.exit(0 if not made and (target / "part2").is_file() else 1)
"""


def test_a_second_producer_is_told_it_waits_and_takes_the_first_ones_entry(
    tmp_path: Path,
) -> None:
    target, told = tmp_path / "gguf" / "entry", tmp_path / "told"
    waiter: list[subprocess.Popen[bytes]] = []

    def build(tmp: Path) -> None:
        # The lock is held now: start a second producer and finish only once it waits.
        waiter.append(subprocess.Popen([sys.executable, "-c", WAITER, str(target), str(told)]))
        deadline = time.monotonic() + 60
        while not told.exists():
            assert time.monotonic() < deadline, "the second producer never waited"
            time.sleep(0.05)
        _build_slowly(str(tmp_path / "builds.log"), tmp)

    assert produce_once(target, build) is True
    assert waiter[0].wait(60) == 0


def test_a_failed_build_leaves_nothing_and_the_next_one_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "downloads" / "pkg-1.0"

    def broken(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "half").write_text("x")
        raise RuntimeError("network went away")

    with pytest.raises(RuntimeError, match="network went away"):
        produce_once(target, broken)
    assert sorted(p.name for p in target.parent.iterdir()) == ["pkg-1.0.lock"]
    assert produce_once(target, lambda tmp: tmp.write_text("whole")) is True
    assert target.read_text() == "whole"
    assert produce_once(target, lambda tmp: tmp.write_text("again")) is False
    assert target.read_text() == "whole"


def test_a_killed_producers_leftovers_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "gguf" / "abc"
    target.parent.mkdir(parents=True)
    stale = target.parent / ".abc.tmp-99999-deadbeef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    assert produce_once(target, lambda tmp: tmp.mkdir()) is True
    assert not stale.exists() and target.is_dir()


def test_a_build_that_creates_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="created nothing"):
        produce_once(tmp_path / "gguf" / "x", lambda tmp: None)
    assert not (tmp_path / "gguf" / "x").exists()


def test_an_entry_accept_rejects_is_built_again_in_place(tmp_path: Path) -> None:
    target = tmp_path / "calibration" / "k.json"
    target.parent.mkdir()
    target.write_text("{half", encoding="utf-8")  # damaged: accept rejects it
    seen: list[str] = []

    def accept(path: Path) -> bool:
        seen.append(path.read_text(encoding="utf-8"))
        return path.read_text(encoding="utf-8") == "good"

    assert produce_once(target, lambda tmp: tmp.write_text("good"), accept=accept)
    assert target.read_text(encoding="utf-8") == "good"
    # Checked before and again under the lock; an accepted entry is left as it is.
    assert seen == ["{half", "{half"]
    assert not produce_once(target, lambda tmp: tmp.write_text("other"), accept=accept)
    assert target.read_text(encoding="utf-8") == "good"
    assert sorted(p.name for p in target.parent.iterdir()) == ["k.json", "k.json.lock"]
    # A rejected directory entry is replaced too (rename alone cannot replace a directory).
    folder = tmp_path / "gguf" / "d"
    (folder / "old").mkdir(parents=True)
    assert produce_once(folder, lambda tmp: tmp.mkdir(), accept=lambda p: False)
    assert folder.is_dir() and not (folder / "old").exists()
