"""pytest-memeval: scene-memory evaluation of causal LMs (base + LoRA adapter) as a pytest plugin.

Public API (everything else is internal and may change):

* :class:`Scenario`, :class:`Benchmark`, :func:`load_jsonl`, :func:`dump_record`,
  :class:`BenchmarkError`: the benchmark format;
* :func:`normalize`: the matching rule;
* :func:`recount_run`: the independent metrics check;
* :mod:`pytest_memeval.evaluation`: the standard eval items to import into a test module.

Heavy dependencies (torch, transformers, peft) are imported only when a model is loaded.
"""

from __future__ import annotations

from pytest_memeval.core.benchmark import (
    Benchmark,
    BenchmarkError,
    Scenario,
    dump_record,
    load_jsonl,
)
from pytest_memeval.core.matching import normalize
from pytest_memeval.core.recount import RecountError, recount_run

__version__ = "0.1.0"

__all__ = [
    "Benchmark",
    "BenchmarkError",
    "RecountError",
    "Scenario",
    "__version__",
    "dump_record",
    "load_jsonl",
    "normalize",
    "recount_run",
]
