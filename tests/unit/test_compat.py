"""pytest_memeval.compat: each helper works on the installed releases, and falls back or says
clearly what is missing when the private name it uses is gone (monkeypatched away).

Configs are real (``pytester.parseconfig``: in-process, no subprocess); the xdist scheduler is
driven with stand-in worker nodes as xdist's own tests (testing/test_dsession.py) drive it. The
same helpers under a real ``-n 2`` run: tests/integration/test_compat_xdist.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import _pytest.config.findpaths
import pytest
import torch
import transformers.cache_utils
import transformers.utils.chat_template_utils
import xdist.remote
import xdist.workermanage
from execnet.gateway_base import get_execmodel
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from xdist.scheduler import LoadScopeScheduling

from pytest_memeval.compat import installed_version
from pytest_memeval.compat import pytest as cpytest
from pytest_memeval.compat import syrupy as csyrupy
from pytest_memeval.compat import textworld_express as ctwx
from pytest_memeval.compat import transformers as ctransformers
from pytest_memeval.compat import xdist as cxdist
from pytest_memeval.guards.snapshot import ByteSnapshot, RecordSnapshot

# --------------------------------------------------------------------------- pytest


def _project(root: Path, ini: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(f"[pytest]\n{ini}\n", encoding="utf-8")
    return root


def _setup_of(root: Path) -> cpytest.Setup:
    setup = cpytest.determine_setup(
        inifile=None, override_ini=None, args=[str(root)], rootdir_cmd_arg=None, invocation_dir=root
    )
    assert setup is not None
    return setup


def test_determine_setup_is_pytests_own_decision(tmp_path: Path) -> None:
    root = _project(tmp_path / "proj", "markers =\n    mine: a marker")
    (root / "sub").mkdir()
    setup = cpytest.determine_setup(
        inifile=None,
        override_ini=["xfail_strict=true"],
        args=[str(root / "sub")],
        rootdir_cmd_arg=None,
        invocation_dir=tmp_path,
    )
    assert setup is not None
    assert (setup.rootpath, setup.inipath) == (root, root / "pytest.ini")
    assert "markers" in setup.inicfg and "xfail_strict" in setup.inicfg


def test_determine_setup_missing_or_of_another_shape_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs: dict[str, Any] = dict(
        inifile=None, override_ini=None, args=[str(tmp_path)], rootdir_cmd_arg=None
    )

    def pytest8(*, inifile: Any, args: Any, rootdir_cmd_arg: Any, invocation_dir: Any) -> Any:
        raise AssertionError("not reached: pytest 8 has no override_ini")  # pragma: no cover

    monkeypatch.setattr(_pytest.config.findpaths, "determine_setup", pytest8)
    assert cpytest.determine_setup(invocation_dir=tmp_path, **kwargs) is None
    monkeypatch.setattr(_pytest.config.findpaths, "determine_setup", lambda **kw: (tmp_path,) * 3)
    assert cpytest.determine_setup(invocation_dir=tmp_path, **kwargs) is None
    monkeypatch.delattr(_pytest.config.findpaths, "determine_setup")
    assert cpytest.determine_setup(invocation_dir=tmp_path, **kwargs) is None


def test_set_config_setup_moves_a_real_config(pytester: pytest.Pytester, tmp_path: Path) -> None:
    config = pytester.parseconfig(str(pytester.path))
    assert cpytest.missing_config_internals(config) == []
    other = _project(tmp_path / "other", "python_files = check_*.py\nminversion = 1.0")
    assert config.getini("python_files") != ["check_*.py"]  # read once: now cached
    cpytest.set_config_setup(config, _setup_of(other))
    assert (config.rootpath, config.inipath) == (other, other / "pytest.ini")
    assert config.getini("python_files") == ["check_*.py"]  # the ini cache was cleared
    cpytest.rerun_config_checks(config)  # minversion 1.0: fine


def test_rerun_config_checks_applies_the_new_files_minversion(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    config = pytester.parseconfig(str(pytester.path))
    cpytest.set_config_setup(config, _setup_of(_project(tmp_path / "p", "minversion = 999")))
    with pytest.raises(pytest.UsageError, match="999"):
        cpytest.rerun_config_checks(config)


def test_set_config_setup_refuses_a_config_without_the_internals(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pytester.parseconfig(str(pytester.path))
    before = config.rootpath
    with monkeypatch.context() as patch:  # undone before pytester unconfigures the config
        patch.delattr(config, "_inicache")
        assert cpytest.missing_config_internals(config) == ["_inicache"]
        with pytest.raises(AttributeError, match="_inicache"):
            cpytest.set_config_setup(config, _setup_of(_project(tmp_path / "p", "")))
    assert config.rootpath == before  # nothing half-applied


def test_line_in_progress_reads_the_real_terminal_reporter(pytester: pytest.Pytester) -> None:
    reporter = pytest.TerminalReporter(pytester.parseconfig(), io.StringIO())
    assert not cpytest.line_in_progress(reporter)
    reporter.write("..")
    assert cpytest.line_in_progress(reporter)
    reporter.write("\n")
    assert not cpytest.line_in_progress(reporter)
    assert not cpytest.line_in_progress(object())  # no _tw: cannot tell, no extra newline


# --------------------------------------------------------------------------- xdist


class FakeNode:
    """What loadscope uses of an xdist ``WorkerController`` (as xdist's own MockNode)."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


class ByLetter(cxdist.ScopeScheduling):
    """Scope = the test name's first letter; records the public hooks xdist reached."""

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config, None)
        self.calls: list[str] = []

    def scope_of(self, nodeid: str) -> str:
        self.calls.append("scope_of")
        return nodeid.split("::")[1][5]

    def assign_work(self, node: Any) -> None:
        self.calls.append("assign_work")
        super().assign_work(node)

    def reschedule(self, node: Any) -> None:
        self.calls.append("reschedule")
        super().reschedule(node)


def test_scope_scheduling_routes_xdists_private_hooks_to_public_names(
    pytester: pytest.Pytester,
) -> None:
    assert cxdist.missing_scope_hooks() == []
    cxdist.require_scope_scheduling()
    sched = ByLetter(pytester.parseconfig("--dist", "load", "--tx", "2*popen"))
    items = [f"t.py::test_{c}{k}" for c in "abcd" for k in range(3)]
    nodes = [FakeNode("gw0"), FakeNode("gw1")]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, items)
    sched.schedule()
    assert {"scope_of", "assign_work"} <= set(sched.calls)
    # loadscope's own assignment, on our scopes: each message is one whole letter.
    sent = [[items[i] for i in msg] for node in nodes for msg in node.sent]
    assert all(len({n.split("::")[1][5] for n in msg}) == 1 for msg in sent)
    queued = [n for unit in sched.work_queue.values() for n in unit]
    assert sorted([n for msg in sent for n in msg] + queued) == sorted(items)
    assert set(sched.work_queue) == {"c", "d"}  # loadscope starts with one scope each
    # The typed views are xdist's own state, not copies.
    assert sched.work_queue is sched.workqueue
    assert sched.assigned is sched.assigned_work and set(sched.assigned) == set(nodes)
    assert sched.collections is sched.registered_collections
    assert sched.collections[nodes[0]] == items
    # Completing a scope's items tops the worker up through reschedule.
    for i in nodes[0].sent[0]:
        sched.mark_test_complete(nodes[0], i)
    assert "reschedule" in sched.calls
    assert len(nodes[0].sent) == 2 and list(sched.work_queue) == ["d"]


def test_a_changed_hook_is_one_clear_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed(LoadScopeScheduling):  # type: ignore[misc]
        def _reschedule(self, node: Any, budget: int) -> None: ...  # pragma: no cover

    assert cxdist.missing_scope_hooks(Changed) == ["_reschedule(self, node)"]
    monkeypatch.delattr(LoadScopeScheduling, "_split_scope")
    assert cxdist.missing_scope_hooks() == ["_split_scope(self, nodeid)"]
    with pytest.raises(pytest.UsageError) as err:
        cxdist.require_scope_scheduling()
    message = str(err.value)
    assert "_split_scope(self, nodeid)" in message
    assert f"pytest-xdist {installed_version('pytest-xdist')}" in message
    assert "pytest-xdist>=3.5,<4" in message


def test_missing_scheduler_state_is_one_clear_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pytester.parseconfig("--dist", "load", "--tx", "2*popen")

    def bare_init(self: Any, config: Any, log: Any = None) -> None:
        self.config = config

    monkeypatch.setattr(LoadScopeScheduling, "__init__", bare_init)
    with pytest.raises(pytest.UsageError, match="workqueue, assigned_work, registered_collections"):
        cxdist.ScopeScheduling(config, None)


class QueueHolder:
    """A plugin shaped like xdist's WorkerInteractor (registered without a name)."""

    def __init__(self, torun: Any, nextitem_index: Any) -> None:
        self.torun = torun
        self.nextitem_index = nextitem_index


def test_pending_item_indices_reads_xdists_worker_queue(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    assert cxdist.pending_item_indices(config) is None  # not an xdist worker
    queue = xdist.remote.TestQueue(get_execmodel("thread"))
    for i in (4, 5, 6):
        queue.put(i)
    config.pluginmanager.register(QueueHolder(queue, 3))
    assert cxdist.pending_item_indices(config) == [3, 4, 5, 6]


def test_pending_item_indices_without_the_queue_api_is_none(pytester: pytest.Pytester) -> None:
    class NoLock:  # xdist 3.5's torun: a plain queue without lock()
        pass

    config = pytester.parseconfig()
    config.pluginmanager.register(QueueHolder(NoLock(), 3))
    assert cxdist.pending_item_indices(config) is None

    class BrokenLock:
        def lock(self) -> Any:
            raise RuntimeError("a changed internal")

    other = pytester.parseconfig()
    other.pluginmanager.register(QueueHolder(BrokenLock(), 3))
    assert cxdist.pending_item_indices(other) is None


def test_worker_specs_and_the_older_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pytester.parseconfig("--tx", "3*popen")
    assert cxdist.worker_specs(config) == ["popen"] * 3
    current = xdist.workermanage.parse_tx_spec_config
    monkeypatch.delattr(xdist.workermanage, "parse_tx_spec_config")
    monkeypatch.setattr(xdist.workermanage, "parse_spec_config", current, raising=False)
    assert cxdist.worker_specs(config) == ["popen"] * 3  # pytest-xdist 3.5's name
    monkeypatch.delattr(xdist.workermanage, "parse_spec_config")
    with pytest.raises(pytest.UsageError, match="parse_tx_spec_config"):
        cxdist.worker_specs(config)


def test_is_xdist_controller_is_the_dsession_plugin(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    assert not cxdist.is_xdist_controller(config)
    config.pluginmanager.register(object(), cxdist.DSESSION_PLUGIN)
    assert cxdist.is_xdist_controller(config)


# --------------------------------------------------------------------------- syrupy


def test_byte_snapshots_write_binary() -> None:
    assert ByteSnapshot._write_mode is WriteMode.BINARY
    assert RecordSnapshot._write_mode is WriteMode.BINARY


def test_binary_file_extension_without_the_switch_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(SingleFileSnapshotExtension, "_write_mode")

    class Text(SingleFileSnapshotExtension):  # type: ignore[misc]
        pass

    with pytest.raises(TypeError, match=r"syrupy .*_write_mode"):
        csyrupy.binary_file_extension(Text)


def test_snapshot_file_name_is_syrupys_sanitised_and_cut_stem() -> None:
    name = 'test_g[a/b:c?"d"<e>|f*\x07]'
    got = csyrupy.snapshot_file_name(ByteSnapshot, name, "raw")
    assert got == "test_g[abcdef].raw"
    assert got == SingleFileSnapshotExtension._sanitize_filename(name) + ".raw"
    long = csyrupy.snapshot_file_name(RecordSnapshot, "test_g[" + "x" * 400 + "]", "jsonl")
    assert long is not None and len(long) == 255  # syrupy's budget: stem + suffix
    assert csyrupy.snapshot_file_name(ByteSnapshot, "t", "") == "t"


def test_snapshot_file_name_without_syrupys_naming_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(SingleFileSnapshotExtension, "_sanitize_filename")  # as in syrupy 6.1
    assert csyrupy.snapshot_file_name(ByteSnapshot, "test_g[a]", "raw") is None


def test_disable_unused_snapshot_check(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    assert config.option.disable_unused_snapshots is False
    assert csyrupy.disable_unused_snapshot_check(config) is True
    assert config.option.disable_unused_snapshots is True
    without = pytester.parseconfig("-p", "no:syrupy")
    assert csyrupy.disable_unused_snapshot_check(without) is False
    assert not hasattr(without.option, "disable_unused_snapshots")


# --------------------------------------------------------------------------- transformers


def test_compile_chat_template_is_transformers_compiled_template() -> None:
    compiled = ctransformers.compile_chat_template("{{ messages[0]['content'] }}|{{ eos }}")
    assert compiled is not None
    assert compiled.render(messages=[{"role": "user", "content": "hi"}], eos="</s>") == "hi|</s>"


def test_compile_chat_template_missing_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(transformers.utils.chat_template_utils, "_compile_jinja_template")
    assert ctransformers.compile_chat_template("{{ 1 }}") is None


def _kv(batch: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(batch * 2 * positions * 4, dtype=torch.float32)
    k = k.reshape(batch, 2, positions, 4)
    return k, -k


def test_full_attention_kv_round_trips_a_dynamic_cache() -> None:
    data = [_kv(3, 5), _kv(3, 5)]
    cache = ctransformers.dynamic_cache(data)
    assert isinstance(cache, transformers.cache_utils.DynamicCache)
    got = ctransformers.full_attention_kv(cache)
    assert got is not None and len(got) == 2
    for (k, v), (k0, v0) in zip(got, data, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)


def test_full_attention_kv_refuses_other_layers_and_caches() -> None:
    cache = ctransformers.dynamic_cache([_kv(1, 4)])
    cache.layers.append(transformers.cache_utils.DynamicSlidingWindowLayer(sliding_window=2))
    assert ctransformers.full_attention_kv(cache) is None  # a window cannot be cut by position
    assert ctransformers.full_attention_kv(object()) is None
    assert ctransformers.full_attention_kv(ctransformers.dynamic_cache([])) is None


def test_full_attention_kv_without_dynamic_layer_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ctransformers.dynamic_cache([_kv(1, 4)])
    monkeypatch.delattr(transformers.cache_utils, "DynamicLayer")  # transformers < 4.54
    assert ctransformers.full_attention_kv(cache) is None


def test_growing_cache_writes_new_positions_in_place_then_concatenates_past_its_room() -> None:
    keys, values = _kv(2, 6)  # capacity 6, the first 3 positions filled
    cache = ctransformers.growing_cache([(keys, values)], filled=3)
    assert cache.get_seq_length() == 3
    first = (keys[..., :3, :].clone(), values[..., :3, :].clone())
    new = (torch.full((2, 2, 2, 4), 7.0), torch.full((2, 2, 2, 4), -7.0))
    got_k, got_v = cache.update(*new, 0)
    assert torch.equal(got_k, torch.cat([first[0], new[0]], dim=2))
    assert torch.equal(got_v, torch.cat([first[1], new[1]], dim=2))
    assert got_k.data_ptr() == keys.data_ptr()  # a view of the buffer: nothing copied
    assert torch.equal(keys[..., 3:5, :], new[0]) and cache.get_seq_length() == 5
    # two more positions than the one left: concatenated, the same values as DynamicLayer's
    more = (torch.full((2, 2, 2, 4), 9.0), torch.full((2, 2, 2, 4), -9.0))
    got_k, got_v = cache.update(*more, 0)
    assert got_k.shape[2] == 7 and got_k.data_ptr() != keys.data_ptr()
    assert torch.equal(got_k, torch.cat([first[0], new[0], more[0]], dim=2))
    assert torch.equal(got_v, torch.cat([first[1], new[1], more[1]], dim=2))
    assert cache.get_seq_length() == 7


# --------------------------------------------------------------------------- textworld_express
# The real env (a JVM): tests/integration/test_env_textworld.py; here, an env without the
# private attributes, as a textworld-express release that renamed them would give.


def test_java_process_without_the_gateway_is_none() -> None:
    class Renamed:
        gateway = object()

    assert ctwx.java_process(Renamed()) is None
    assert ctwx.java_process(object()) is None


def test_mark_disconnected_without_the_client_does_nothing() -> None:
    class Renamed:
        gateway = object()

    env = Renamed()
    ctwx.mark_disconnected(env)
    assert vars(env) == {}


def test_close_env_without_the_gateway_falls_back_to_close_and_disarms_it() -> None:
    closed: list[str] = []

    class Renamed:
        def close(self) -> None:
            closed.append("close")

    env = Renamed()
    ctwx.close_env(env)
    env.close()  # what its __del__ would call: now nothing
    assert closed == ["close"]
