"""Pages of a closed-loop run (``metrics.json`` of kind ``episodes``, docs/closed-loop.md).

``memeval report RUN`` on an episode run renders ``episodes.html``: the run's numbers
(success with its 95% Wilson interval, mean score, steps, the invalid-action rate, each
termination reason), the same numbers per slice (tag), and every episode's trajectory: the
first observation, then each step's action and the environment's answer, whether the action
was valid, its reward and the score, and how the episode ended. The template is autoescaped
(:mod:`.templating`): an action or an observation holding ``<script>`` is printed as those
characters. :func:`episode_markdown` is the same run's numbers in Markdown (the CI step
summary's body for an episode run).

The run is read and recounted by the loader of ``memeval compare`` (its ``read_episode_run``
and ``recount_episode_run``): a run whose numbers disagree with its records is refused, as a
scenario run is. An incomplete run
(environment errors, episodes not run) is shown, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from pytest_memeval.core.episode_records import EpisodeRecord, EpisodeRunMetrics
from pytest_memeval.core.episodes import EpisodeMetrics
from pytest_memeval.core.formatting import percent
from pytest_memeval.core.rundir import METRICS, PREDICTIONS
from pytest_memeval.tools.compare import (
    CompareError,
    EpisodeRun,
    fmt_ci,
    fmt_rate,
    read_episode_run,
    recount_episode_run,
)
from pytest_memeval.tools.gate import GateOutcome
from pytest_memeval.tools.report.markdown import gate_lines, md_code, md_text
from pytest_memeval.tools.report.pages import generated_at, page_csp
from pytest_memeval.tools.report.templating import render

__all__ = [
    "NumberRow",
    "episode_markdown",
    "load_episode_run",
    "number_rows",
    "render_episode_report",
]


class NumberRow(NamedTuple):
    """One line of the run's numbers: its name, the count or value, and the detail."""

    name: str
    value: str
    detail: str


def load_episode_run(path: Path) -> EpisodeRun:
    """Read and recount the episode run at ``path``, complete or not (an incomplete run is
    shown, and says so); raise :class:`CompareError` naming the file (and line, field) of
    what is wrong. It is read as ``memeval compare`` reads it
    (:func:`~pytest_memeval.tools.compare.read_episode_run`)."""
    run = read_episode_run(path)
    differences = recount_episode_run(run)
    if differences:
        raise CompareError(
            f"{path / METRICS}: the numbers differ from the recount of {path / PREDICTIONS} "
            f"({', '.join(differences)})"
        )
    return run


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def number_rows(numbers: EpisodeMetrics) -> list[NumberRow]:
    """The numbers of a run (or a slice) as rows, shared by the HTML page and the Markdown."""
    steps, invalid = numbers["steps"], numbers["invalid_actions"]
    ended = ", ".join(
        f"{reason.replace('_', ' ')} {count}"
        for reason, count in numbers["reasons"].items()
        if count
    )
    return [
        NumberRow(
            "success",
            fmt_rate(numbers["success"]),
            f"95% Wilson interval {fmt_ci(numbers['success'])}",
        ),
        NumberRow("mean score", _num(numbers["mean_score"]), "over the scored episodes"),
        NumberRow(
            "steps",
            str(steps["total"]),
            f"mean {_num(steps['mean'])}, mean when successful {_num(steps['mean_successful'])}",
        ),
        NumberRow(
            "invalid actions",
            "n/a" if invalid["rate"] is None else percent(invalid["rate"]),
            f"{invalid['invalid']} of the {invalid['judged']} actions the environment judged",
        ),
        NumberRow("truncated outputs", str(numbers["truncated_outputs"]), "at the token limit"),
        NumberRow(
            "environment errors",
            str(numbers["errors"]),
            "not counted against the model",
        ),
        NumberRow("ended by", str(numbers["episodes"]), ended or "no episode"),
    ]


def _slice_row(tag: str, block: EpisodeMetrics) -> list[str]:
    """One row of the by-slice table: the tag, then :data:`SLICE_COLUMNS`' values."""
    rate = block["invalid_actions"]["rate"]
    return [
        tag,
        str(block["episodes"]),
        fmt_rate(block["success"]),
        fmt_ci(block["success"]),
        _num(block["mean_score"]),
        _num(block["steps"]["mean"]),
        "n/a" if rate is None else percent(rate),
        ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in block["reasons"].items() if v),
    ]


#: the by-slice table's columns (:func:`_slice_row`)
SLICE_COLUMNS = (
    "slice",
    "episodes",
    "success",
    "95% interval",
    "mean score",
    "mean steps",
    "invalid actions",
    "ended by",
)


def _valid_word(valid: bool | None) -> str:
    return "—" if valid is None else ("valid" if valid else "invalid")


def _episode_view(record: EpisodeRecord) -> dict[str, Any]:
    """One episode as the template shows it."""
    invalid = sum(s["valid"] is False for s in record["trajectory"])
    return {
        "id": record["id"],
        "seed": record["seed"],
        "success": record["success"],
        "reason": record["reason"].replace("_", " "),
        "score": _num(record["score"]),
        "steps": record["steps"],
        "invalid": invalid,
        "error": record["error"],
        "observation": record["observation"],
        "system": record["system"],
        "tags": record["tags"],
        "trajectory": [
            {
                "n": n,
                "action": s["action"],
                "observation": s["observation"],
                "valid": _valid_word(s["valid"]),
                "valid_class": "na" if s["valid"] is None else ("ok" if s["valid"] else "bad"),
                "reward": f"{s['reward']:g}",
                "score": "—" if s["score"] is None else f"{s['score']:g}",
                "truncated": s["truncated_output"],
            }
            for n, s in enumerate(record["trajectory"], start=1)
        ],
    }


def _incomplete_note(metrics: EpisodeRunMetrics) -> str | None:
    parts = []
    if metrics["error_ids"]:
        parts.append(f"environment error in {len(metrics['error_ids'])} episode(s)")
    if metrics["missing"]:
        parts.append(f"{len(metrics['missing'])} episode(s) not run")
    return "INCOMPLETE: " + "; ".join(parts) if parts else None


def render_episode_report(run: EpisodeRun) -> str:
    """The self-contained HTML page of one episode run (autoescaped; it loads nothing)."""
    metrics = run.metrics
    env = metrics["env"]
    return render(
        "episodes.html",
        title=f"memeval closed loop: {run.label}",
        csp=page_csp(None),  # no script on this page
        generated=generated_at(),
        run_path=str(run.path),
        profile=metrics["profile"],
        env_line=(
            f"{env.get('backend')} {env.get('version', '')} {env.get('game')} "
            f"fold {env.get('fold')}"
        ),
        params=sorted((str(k), json.dumps(v)) for k, v in env.items()),
        incomplete=_incomplete_note(metrics),
        rows=number_rows(metrics["episodes"]),
        slice_columns=SLICE_COLUMNS,
        episodes_n=metrics["episodes"]["episodes"],
        slices=[_slice_row(tag, block) for tag, block in metrics["slices"].items()],
        episodes=[_episode_view(r) for r in run.records.values()],
        wall_s=metrics["wall_s"],
    )


def episode_markdown(
    label: str,
    run_dir: Path,
    metrics: EpisodeRunMetrics,
    *,
    exitstatus: int | None = None,
    gate: GateOutcome | None = None,
) -> str:
    """The Markdown summary of an episode run: the numbers, completeness, each slice, and
    the gate's verdict and checks when a gate decided the session (``gate``)."""
    numbers = metrics["episodes"]
    env = metrics["env"]
    lines = [
        f"### memeval closed loop: {md_text(label)}",
        "",
        f"{md_text(str(env.get('backend')))} {md_text(str(env.get('game')))}, fold "
        f"{md_text(str(env.get('fold')))}: {numbers['episodes']} episode(s), "
        + ("complete" if metrics["complete"] else "**incomplete**")
        + (f", exit status {exitstatus}" if exitstatus is not None else ""),
        "",
        "| | value | detail |",
        "|---|---:|---|",
    ]
    lines += [f"| {r.name} | {r.value} | {r.detail} |" for r in number_rows(numbers)]
    note = _incomplete_note(metrics)
    if note:
        lines += ["", note]
    if gate is not None and gate.checks:
        lines += ["", *gate_lines(gate, exitstatus)[:-1]]  # its closing blank line: below
    if metrics["slices"]:
        lines += [
            "",
            "| slice | episodes | success | 95% interval | mean score | invalid actions |",
            "|---|---:|---:|---|---:|---:|",
        ]
        for tag, block in metrics["slices"].items():
            rate = block["invalid_actions"]["rate"]
            lines.append(
                f"| {md_code(tag)} | {block['episodes']} | {fmt_rate(block['success'])} | "
                f"{fmt_ci(block['success'])} | {_num(block['mean_score'])} | "
                f"{'n/a' if rate is None else percent(rate)} |"
            )
    lines += ["", f"run directory: {md_code(str(run_dir), table=False)}", ""]
    return "\n".join(lines)
