"""``memeval gpu-check``: the first run on a GPU in one command (:mod:`.command`), its report
read and written by :mod:`.report`. This package's names are imported from here."""

from __future__ import annotations

from pytest_memeval.tools.gpu_check.command import SIZES, cli_arguments, make_plan
from pytest_memeval.tools.gpu_check.report import (
    Report,
    Step,
    StepResult,
    bench_facts,
    read_pytest_run,
    render,
    step_result,
)

__all__ = [
    "SIZES",
    "Report",
    "Step",
    "StepResult",
    "bench_facts",
    "cli_arguments",
    "make_plan",
    "read_pytest_run",
    "render",
    "step_result",
]
