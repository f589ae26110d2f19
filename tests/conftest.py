"""Shared fixtures for the plugin's own tests.

``memeval_project`` lays out a throwaway pytest project (via ``pytester``) that evaluates a
few scenarios of the bundled demo benchmark with the bundled demo checkpoint: real
transformers + peft on a real tiny model, no mocks, small enough for these 2-core machines.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo"
BASE_MODEL = DEMO / "checkpoint" / "base"
ADAPTERS = DEMO / "checkpoint" / "adapters"

EVAL_MODULE = "from pytest_memeval.evaluation import test_final_query, test_turns  # noqa: F401\n"


def demo_records(variant: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` validation records of a demo variant (``baseline`` or ``oracle``)."""
    path = DEMO / "data" / variant / "val.jsonl"
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for _, line in zip(range(n), fh, strict=False)]


def write_jsonl(path: Path, records: Sequence[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


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
        """Write ``bench.jsonl``, ``pyproject.toml`` (profiles ``demo``, ``base``, ``replay``
        plus ``profiles``) and the eval module. Returns the benchmark path."""
        bench = write_jsonl(self.path / "bench.jsonl", records or demo_records(variant, n))
        adapter = ADAPTERS / variant
        self.pytester.makefile(
            ".toml",
            pyproject=textwrap.dedent(
                f"""
                [tool.pytest.ini_options]
                addopts = "-p no:cacheprovider -p no:randomly"
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
            + textwrap.dedent(profiles),
        )
        self.pytester.makepyfile(test_eval=EVAL_MODULE)
        return bench

    def run(self, *args: str, timeout: float = 300) -> pytest.RunResult:
        """Run pytest in a subprocess (xdist workers need real processes)."""
        return self.pytester.runpytest_subprocess(*args, timeout=timeout)

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


@pytest.fixture
def memeval_project(pytester: pytest.Pytester) -> MemevalProject:
    return MemevalProject(pytester)
