"""The JUnit XML schema pytest targets (its default family, xunit2), for validating the files
the plugin rewrites.

pytest's own test suite validates its JUnit output against ``junit-10.xsd``, which pytest
ships in its source distribution (``testing/example_scripts/``), not in the wheel. It is taken
from the source distribution of the installed pytest version, downloaded once with pip from
the package index (the ordinary client) and cached; nothing of it is kept in this repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

MEMBER = "testing/example_scripts/junit-10.xsd"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pytest-memeval"


def junit_xsd() -> Path | None:
    """The xunit2 schema of the installed pytest version, or ``None`` if it cannot be had."""
    target = CACHE / f"pytest-{pytest.__version__}-junit-10.xsd"
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"pytest=={pytest.__version__}",
                "-d",
                tmp,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        sdists = sorted(Path(tmp).glob("pytest-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            return None
        with tarfile.open(sdists[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(MEMBER)), None)
            handle = tar.extractfile(member) if member is not None else None
            if handle is None:
                return None
            data = handle.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".tmp")
    partial.write_bytes(data)
    partial.replace(target)
    return target
