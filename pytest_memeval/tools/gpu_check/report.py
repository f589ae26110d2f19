"""What ``memeval gpu-check`` reads off each step's output, and its Markdown report.

The bench lines read here are the ones ``tools/bench.py`` prints (its last line, ``floor:``,
``exact mode:``, ``calibration:``, the disagreement table); the pytest run is read from its
terminal output (the ``memeval:`` header lines that show the device binding, the summary) and
from its run directory (``predictions.jsonl``: which worker on which device decoded each
scenario; ``metrics.json``: throughput and ``mean batch``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_memeval.core.rundir import METRICS, PREDICTIONS
from pytest_memeval.decode.fast import batching_rules

__all__ = [
    "BenchFacts",
    "PytestRun",
    "Report",
    "Step",
    "StepResult",
    "bench_facts",
    "read_pytest_run",
    "render",
    "step_result",
]

#: Lines of a step's output kept in the report (the end: where the results are).
OUTPUT_LINES = 120
_VERDICT = re.compile(
    r"^fast/reference speedup: (?P<speedup>\S+)x, predictions identical: (?P<identical>yes|no)$",
    re.M,
)
_FLOOR = re.compile(r"^floor:\s+(?P<floor>[\d.]+) s .*fast path (?P<times>[\d.]+)x the floor", re.M)
_TIMES = re.compile(r"^(?P<path>reference|fast):\s+(?P<seconds>[\d.]+) s", re.M)
#: bench lines that carry the exact stage's and the calibration's figures
_EXACT_PREFIXES = (
    "exact mode:",
    "calibration:",
    "fast without calibration:",
    "handed to the reference call:",
    "first answer token",
    "later answer tokens",
    "fast generate",
    "verification pass",
    "exact steps from the forward pass's cache",
    "peak accelerator memory",
)
#: pytest output lines that show the binding and the summary
_PYTEST_PREFIXES = (
    "memeval:",
    "ckpt ",
    "m1 final-query",
    "m2 turn-level",
    "throughput:",
    "calibration",
)


@dataclass(frozen=True)
class Step:
    """One step of the check: its title, kind (``env``, ``bench``, ``pytest``) and command
    (``None``: it cannot run, and ``note`` says why)."""

    title: str
    kind: str
    argv: list[str] | None
    note: str = ""
    #: the command as the report shows it (default: ``argv``)
    shown: str = ""

    def command(self) -> str:
        """The command as the report shows it: ``python -m ...``."""
        if self.shown or self.argv is None:
            return self.shown
        return " ".join(["python", *(a if a else "''" for a in self.argv[1:])])


@dataclass(frozen=True)
class BenchFacts:
    """What one bench printed that the summary table shows."""

    speedup: str | None = None
    identical: str | None = None
    reference_s: str | None = None
    fast_s: str | None = None
    floor_s: str | None = None
    fast_over_floor: str | None = None
    exact_mode: str | None = None
    exact_lines: tuple[str, ...] = ()


def bench_facts(output: str) -> BenchFacts:
    """The figures of a ``memeval bench`` output (``None`` where a line is missing: a bench
    cut short or failed)."""
    verdict, floor = _VERDICT.search(output), _FLOOR.search(output)
    times = {m["path"]: m["seconds"] for m in _TIMES.finditer(output)}
    lines = tuple(
        line.strip() for line in output.splitlines() if line.strip().startswith(_EXACT_PREFIXES)
    )
    mode = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("exact")), None)
    return BenchFacts(
        speedup=verdict["speedup"] if verdict else None,
        identical=verdict["identical"] if verdict else None,
        reference_s=times.get("reference"),
        fast_s=times.get("fast"),
        floor_s=floor["floor"] if floor else None,
        fast_over_floor=floor["times"] if floor else None,
        exact_mode=mode,
        exact_lines=lines,
    )


@dataclass(frozen=True)
class PytestRun:
    """What the pytest step's run directory holds: scenarios per (worker, device) as the
    records name them, and the metrics' timing."""

    bindings: dict[tuple[str, str], int]
    timing: dict[str, object]
    n: int | None


def read_pytest_run(run_dir: Path) -> PytestRun | None:
    """The finished run in ``run_dir`` (``None`` when there is none: the run failed or was
    cut short)."""
    predictions, metrics = run_dir / PREDICTIONS, run_dir / METRICS
    if not predictions.is_file() or not metrics.is_file():
        return None
    bindings: Counter[tuple[str, str]] = Counter()
    with predictions.open(encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            bindings[(str(record.get("worker", "?")), str(record.get("device", "?")))] += 1
    data = json.loads(metrics.read_text(encoding="utf-8"))
    n = data.get("n")
    timing = dict(data.get("timing") or {})
    return PytestRun(dict(bindings), timing, n if isinstance(n, int) else None)


@dataclass
class StepResult:
    """One step as it ran: ``status`` is ``ok``, ``differs`` (a bench's predictions),
    ``failed``, ``timed out``, ``skipped`` (the budget) or ``absent`` (it cannot run here)."""

    step: Step
    status: str
    seconds: float
    output: str
    note: str = ""
    bench: BenchFacts | None = None
    run: PytestRun | None = None


def step_result(
    step: Step,
    output: str,
    code: int | None,
    seconds: float,
    timed_out: bool,
    limit_s: float,
    run: PytestRun | None,
) -> StepResult:
    """A finished (or cut) step's result: its status read from the exit status (a pytest
    run's failed eval items are the model's wrong answers: exit 1 with a finished run is
    ``ok``)."""
    bench = bench_facts(output) if step.kind == "bench" else None
    if timed_out:
        status, note = "timed out", f"cut at {limit_s:.0f} s"
    elif step.kind == "bench" and code in (0, 1) and bench and bench.identical:
        status, note = ("ok" if code == 0 else "differs"), ""
    elif step.kind == "pytest" and code in (0, 1) and run is not None:
        status, note = "ok", "" if code == 0 else "exit 1: failed eval items (wrong answers)"
    elif code == 0:
        status, note = "ok", ""
    else:
        status, note = "failed", f"exit status {code}"
    return StepResult(step, status, seconds, output, note, bench, run)


@dataclass
class Report:
    """The whole check so far."""

    device: str
    command: str
    budget_s: float
    workers: int
    gpus: Sequence[str]
    results: list[StepResult] = field(default_factory=list)
    seconds: float = 0.0
    done: bool = False

    @property
    def ok(self) -> bool:
        """Every step that could run finished, and every bench's predictions were identical."""
        return self.done and all(r.status in ("ok", "absent") for r in self.results)

    def verdict_lines(self) -> list[str]:
        """One line per step, then the verdict (also the terminal's last lines)."""
        lines = [
            f"{r.step.title}: {r.status}" + (f" ({r.note})" if r.note else "") for r in self.results
        ]
        state = "finished" if self.done else "still running"
        verdict = "every step ran, predictions identical" if self.ok else "NOT all ok: see above"
        lines.append(f"{state} after {self.seconds:.0f} s of {self.budget_s:.0f} s; {verdict}")
        return lines


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value).replace("|", "\\|")


def _summary_table(report: Report) -> Iterator[str]:
    columns = ["step", "status", "seconds", "speedup", "identical", "reference s", "fast s"]
    columns += ["floor s", "fast / floor", "exact mode"]
    yield "| " + " | ".join(columns) + " |"
    yield "|" + "---|" * len(columns)
    for r in report.results:
        b = r.bench or BenchFacts()
        status = r.status + (f": {r.note}" if r.note else "")
        cells = (
            r.step.title,
            status,
            f"{r.seconds:.1f}" if r.seconds else None,
            f"{b.speedup}x" if b.speedup else None,
            b.identical,
            b.reference_s,
            b.fast_s,
            b.floor_s,
            f"{b.fast_over_floor}x" if b.fast_over_floor else None,
            b.exact_mode,
        )
        yield "| " + " | ".join(_cell(c) for c in cells) + " |"


def _rules(device: str) -> Iterator[str]:
    kind = "cuda" if device == "cuda" else "cpu"
    for dtype in ("float32", "bfloat16"):
        yield f"- {dtype}: {batching_rules(kind, dtype).describe()}"


def _pytest_section(r: StepResult) -> Iterator[str]:
    lines = [
        line.strip()
        for line in r.output.splitlines()
        if line.strip().startswith(_PYTEST_PREFIXES) or re.match(r"^=+ .* in [\d.]+s", line)
    ]
    yield "Binding and summary, as pytest printed them:"
    yield "```"
    yield from lines or ["(none: see the output below)"]
    yield "```"
    if r.run is None:
        yield "No finished run to read (see the output below)."
        return
    yield "Scenarios per worker and device, as the records name them (`worker`, `device`):"
    yield ""
    yield "| worker | device | scenarios |"
    yield "|---|---|---|"
    for (worker, device), count in sorted(r.run.bindings.items()):
        yield f"| {_cell(worker)} | {_cell(device)} | {count} |"
    yield ""
    t = r.run.timing
    yield (
        f"metrics.json: {r.run.n} scenarios, {t.get('scenarios_per_s')} scenarios/s over "
        f"{t.get('wall_s')} s, mean batch {t.get('mean_batch')} of {t.get('batch_size')} "
        '(docs/decoding.md, "What `mean batch M of B` is")'
    )


def _step_section(r: StepResult) -> Iterator[str]:
    yield f"## {r.step.title}"
    yield ""
    yield (
        f"Status: **{r.status}**"
        + (f" ({r.note})" if r.note else "")
        + (f", {r.seconds:.1f} s" if r.seconds else "")
    )
    if r.step.argv is not None and r.status != "skipped":
        yield ""
        yield (
            "Command (run in the check's own temporary directory): `"
            + " ".join(a if a else "''" for a in r.step.argv[1:])
            + "`"
        )
    if r.bench is not None and r.bench.exact_lines:
        yield ""
        yield "Exact stage and calibration:"
        yield "```"
        yield from r.bench.exact_lines
        yield "```"
    if r.step.kind == "pytest" and r.status not in ("skipped", "absent"):
        yield ""
        yield from _pytest_section(r)
    if r.output:
        tail = r.output.rstrip().splitlines()[-OUTPUT_LINES:]
        yield ""
        yield f"Output (last {len(tail)} lines):"
        yield "```"
        yield from tail
        yield "```"
    yield ""


def render(report: Report) -> str:
    """The report as Markdown."""
    gpus = ", ".join(report.gpus) if report.gpus else "none (CPU)"
    head = [
        "# memeval gpu-check",
        "",
        f"Command: `{report.command}`; device {report.device}, GPUs {gpus}, "
        f"{report.workers} pytest worker(s), budget {report.budget_s:.0f} s.",
        "",
        *("- " + line for line in report.verdict_lines()),
        "",
        "Batching rules of the fast path on this device (decode/fast/rules.py):",
        *_rules(report.device),
        "",
        "## Summary",
        "",
        *_summary_table(report),
        "",
        "What to read: the summary's `identical` column (every bench must say yes), "
        "`fast / floor` (how close the fast path comes to one forward pass over every "
        "conversation), the exact mode and the `row_step`/`first`/`step` lines of each bench "
        "(what batched 16-bit passes cost in bounds on this device), and the pytest step's "
        "binding table (one device per worker) and `mean batch` (full passes: close to the "
        "rules' batch size).",
        "",
    ]
    body = [line for r in report.results for line in _step_section(r)]
    return "\n".join(head + body) + "\n"
