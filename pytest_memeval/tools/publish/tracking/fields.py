"""A finished run as an experiment tracker sees it: parameters, metrics, tags, artifacts.

Tracker-neutral (plain strings and floats, files in a folder), so MLflow (:mod:`.mlflow`) and
any other tracker a team plugs into ``pytest_memeval_run_finished`` log the same run alike
(docs/ci-and-tracking.md lists every name).

* **parameters** (:func:`run_params`): what was evaluated and how: the profile, the model and
  adapter directories with their fingerprints, the benchmark and its fingerprint, the
  command-line overrides, the decoding settings, the history (``truth``: teacher-forced;
  ``model``: free-running);
* **metrics** (:func:`run_metrics`): m1 and m2 with their 95% interval bounds and counts, the
  unaligned and unparseable counts, the timing, and per slice (tag) its n, m1 and m2;
* **tags** (:func:`run_tags`): complete or not, the gate's verdict, the exit status, the git
  commit of the project (when it is a git checkout, or a CI variable names it);
* **artifacts** (:func:`stage_artifacts`): the run directory's files, the HTML report of the
  run (against the baseline when the gate had one), the Markdown summary, pytest-html's page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pytest_memeval.core.episode_records import EpisodeRunMetrics
from pytest_memeval.core.episodes import EpisodeMetrics
from pytest_memeval.core.history import history_of
from pytest_memeval.core.records import Metrics, RateBlock
from pytest_memeval.core.rundir import JOURNAL, METRICS, PREDICTIONS
from pytest_memeval.tools.compare import CompareError
from pytest_memeval.tools.publish.finished import FinishedRun
from pytest_memeval.tools.publish.step_summary import finished_run_markdown
from pytest_memeval.tools.report import write_report

__all__ = [
    "GitState",
    "episode_params",
    "episode_run_metrics",
    "finished_run_metrics",
    "git_state",
    "rate_metrics",
    "run_metrics",
    "run_params",
    "run_tags",
    "slice_metric_name",
    "stage_artifacts",
]

#: The most characters of a parameter value (MLflow servers before 2.x kept 500)
PARAM_LIMIT = 500
#: CI variables that name the commit being built, read when the project is not a git checkout
COMMIT_VARIABLES = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILD_VCS_NUMBER", "GIT_COMMIT")


def _cut(text: str) -> str:
    return text if len(text) <= PARAM_LIMIT else text[: PARAM_LIMIT - 1] + "…"


def episode_params(run: FinishedRun, m: EpisodeRunMetrics) -> dict[str, str]:
    """What an episode run ran: the profile, model and adapter, the environment (``env.*``:
    backend, version, game, parameters, fold, seeds, limits) and the fingerprints."""
    profile = run.profile
    params: dict[str, str] = {
        "ckpt": run.ckpt,
        "kind": profile.kind,
        "run_kind": "episodes",
        "episodes": str(m["episodes"]["episodes"]),
    }
    if profile.kind == "model":
        params["model"] = str(profile.model)
        params["adapter"] = str(profile.adapter) if profile.adapter is not None else "none"
    for key, value in sorted(m["env"].items()):
        params[f"env.{key}"] = value if isinstance(value, str) else json.dumps(value)
    for part, value in sorted(m["fingerprints"].items()):
        params[f"fingerprint.{part}"] = value if isinstance(value, str) else json.dumps(value)
    return {key: _cut(value) for key, value in params.items()}


def _episode_numbers(prefix: str, numbers: EpisodeMetrics) -> dict[str, float]:
    """``<prefix>success`` (with its interval and counts), score, steps, invalid actions,
    truncated outputs and each termination reason's count."""
    out = rate_metrics(f"{prefix}success", numbers["success"])
    out[f"{prefix}episodes"] = float(numbers["episodes"])
    out[f"{prefix}errors"] = float(numbers["errors"])
    optional = {
        "mean_score": numbers["mean_score"],
        "steps_mean": numbers["steps"]["mean"],
        "steps_mean_successful": numbers["steps"]["mean_successful"],
        "invalid_action_rate": numbers["invalid_actions"]["rate"],
    }
    out.update({f"{prefix}{k}": float(v) for k, v in optional.items() if v is not None})
    out[f"{prefix}steps"] = float(numbers["steps"]["total"])
    out[f"{prefix}invalid_actions"] = float(numbers["invalid_actions"]["invalid"])
    out[f"{prefix}truncated_outputs"] = float(numbers["truncated_outputs"])
    for reason, count in numbers["reasons"].items():
        out[f"{prefix}reason/{reason}"] = float(count)
    return out


def episode_run_metrics(metrics: EpisodeRunMetrics) -> dict[str, float]:
    """An episode run's numbers (``success`` with ``success_ci95_low``/``_high``,
    ``mean_score``, ``steps_mean``, ``invalid_action_rate``, ``reason/<reason>``, ...), the
    wall time, and each slice's under :func:`slice_metric_name` (``slice/game:twc/success``)."""
    out = _episode_numbers("", metrics["episodes"])
    if isinstance(metrics["wall_s"], (int, float)):
        out["wall_s"] = float(metrics["wall_s"])
    for tag, block in metrics["slices"].items():
        out.update(_episode_numbers(f"{slice_metric_name(tag)}/", block))
    return out


def finished_run_metrics(run: FinishedRun) -> dict[str, float]:
    """The numbers a tracker logs of ``run``: :func:`run_metrics` of a scenario run,
    :func:`episode_run_metrics` of an episode run."""
    if run.episodes is not None:
        return episode_run_metrics(run.episodes)
    return run_metrics(run.metrics)


def run_params(run: FinishedRun) -> dict[str, str]:
    """What was evaluated and how (each value a string, cut at :data:`PARAM_LIMIT`); of an
    episode run, :func:`episode_params`."""
    if run.episodes is not None:
        return episode_params(run, run.episodes)
    profile, m = run.profile, run.metrics
    fingerprints = m.get("fingerprints") or {}
    decoding = m.get("decoding") or {}
    params: dict[str, str] = {
        "ckpt": run.ckpt,
        "kind": profile.kind,
        "benchmark": profile.benchmark.describe(),
        "n": str(m["n"]),
    }
    if profile.kind == "model":
        params["model"] = str(profile.model)
        params["adapter"] = str(profile.adapter) if profile.adapter is not None else "none"
    else:
        params["predictions"] = str(profile.predictions)
    for part, value in sorted(fingerprints.items()):
        params[f"fingerprint.{part}"] = str(value)
    for key, value in sorted(decoding.items()):
        params[f"decoding.{key}"] = str(value)
    for key, entry in sorted((m.get("overrides") or {}).items()):
        value = entry.get("value") if isinstance(entry, Mapping) else entry
        params[f"override.{key}"] = str(value)
    # Teacher-forced and free-running runs of one checkpoint must not read as one series.
    params["history"] = history_of(m)
    return {key: _cut(value) for key, value in params.items()}


def rate_metrics(prefix: str, block: RateBlock) -> dict[str, float]:
    """One rate with its 95% interval bounds and counts: ``<prefix>``, ``<prefix>_ci95_low``,
    ``<prefix>_ci95_high``, ``<prefix>_correct``, ``<prefix>_total`` (no rate when nothing
    was scored). The unit :func:`run_metrics` is made of: per-slice rates are more of it."""
    out = {f"{prefix}_correct": float(block["correct"]), f"{prefix}_total": float(block["total"])}
    if block["rate"] is not None:
        out[prefix] = float(block["rate"])
    ci = block.get("ci95")
    if ci:
        out[f"{prefix}_ci95_low"], out[f"{prefix}_ci95_high"] = float(ci[0]), float(ci[1])
    return out


def run_metrics(metrics: Metrics) -> dict[str, float]:
    """A run's numbers: m1 and m2 (:func:`rate_metrics`), the counts, the timing, and each
    slice's n, m1 and m2 under :func:`slice_metric_name`."""
    out = {**rate_metrics("m1", metrics["m1"]), **rate_metrics("m2", metrics["m2"])}
    out["n"] = float(metrics["n"])
    out["unaligned"] = float(metrics["unaligned"])
    out["parse_fail_final"] = float(metrics["parse_fail"]["final"])
    out["parse_fail_turns"] = float(metrics["parse_fail"]["turns"])
    timing = metrics.get("timing") or {}
    for key in ("wall_s", "scenarios_per_s"):
        value = timing.get(key)
        if isinstance(value, (int, float)):
            out[key] = float(value)
    for tag, block in (metrics.get("slices") or {}).items():
        name = slice_metric_name(tag)
        out[f"{name}/n"] = float(block["n"])
        out.update(rate_metrics(f"{name}/m1", block["m1"]))
        out.update(rate_metrics(f"{name}/m2", block["m2"]))
    left = metrics.get("left_truth")
    if left is not None:
        # Where the scenarios first left the truth (the error propagation of free-running).
        out["left_truth_scenarios"] = float(sum(left["at"].values()))
        out["left_truth_never"] = float(left["never"])
        still = left["still_right"]
        out.update(
            rate_metrics(
                "still_right_after",
                {
                    "correct": still["correct"],
                    "total": still["total"],
                    "rate": still["correct"] / still["total"] if still["total"] else None,
                },
            )
        )
    return out


#: Characters a tag may hold (docs/results-schema.md, "Tags and meta") that MLflow refuses in a
#: metric name (it takes letters, digits, ``_ - . : /`` and spaces), each spelled out between
#: spaces: a tag holds no space, so two tags never share a name. ``=`` is in an episode run's
#: parameter tags (``numLocations=1``).
_SPELLED_OUT = {"+": " plus ", "@": " at ", "=": " eq "}


def slice_metric_name(tag: str) -> str:
    """``slice/<tag>``: the prefix of one slice's metrics (``slice/query:door-state/m1``,
    ``.../m1_ci95_low``, ``.../n``), with ``+``, ``@`` and ``=`` spelled out (`` plus ``,
    `` at ``, `` eq ``) for trackers that refuse them."""
    return "slice/" + "".join(_SPELLED_OUT.get(c, c) for c in tag)


@dataclass(frozen=True)
class GitState:
    """The commit the project is at, and whether tracked files differ from it."""

    commit: str | None
    dirty: bool | None


def git_state(root: Path) -> GitState:
    """``git rev-parse HEAD`` in ``root`` (and whether ``git status`` shows changes to
    tracked files); without git or a checkout, the commit a CI variable names, if any."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if head.returncode == 0 and head.stdout.strip():
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return GitState(head.stdout.strip(), dirty)
    except (OSError, subprocess.TimeoutExpired):
        pass
    commit = next((os.environ[v] for v in COMMIT_VARIABLES if os.environ.get(v)), None)
    return GitState(commit, None)


def run_tags(run: FinishedRun, git: GitState) -> dict[str, str]:
    """How the run ended and where it came from."""
    tags = {
        "memeval.complete": "true" if run.complete else "false",
        "memeval.gate": (
            ("passed" if run.gate.passed else "failed")
            if run.gate is not None and run.gate.checks
            else "none"
        ),
        "memeval.exitstatus": str(run.exitstatus),
        "memeval.run_dir": str(run.run_dir),
        "memeval.version": metadata.version("pytest-memeval"),
        "memeval.kind": run.kind,
    }
    if run.baseline is not None:
        tags["memeval.baseline"] = str(run.baseline)
    if git.commit:
        tags["git.commit"] = git.commit
    if git.dirty is not None:
        tags["git.dirty"] = "true" if git.dirty else "false"
    return tags


def stage_artifacts(run: FinishedRun, into: Path) -> list[str]:
    """Copy what a tracker keeps of ``run`` into the empty folder ``into``; return the names.

    ``run/``: the run directory's own files (``metrics.json``, ``predictions.jsonl``,
    ``journal.jsonl``; not the earlier runs beside them); ``report.html``: the ``memeval
    report`` page of the run, against the gate's baseline when there is one; ``summary.md``:
    the Markdown summary; ``pytest-html/``: the ``--html`` page, when written.
    """
    names = []
    (into / "run").mkdir()
    for name in (METRICS, PREDICTIONS, JOURNAL):
        source = run.run_dir / name
        if source.is_file():
            shutil.copy2(source, into / "run" / name)
            names.append(f"run/{name}")
    page = into / "report.html"
    pages = [[run.baseline, run.run_dir]] if run.baseline is not None else []
    for runs in [*pages, [run.run_dir]]:  # against the baseline, else this run alone
        try:
            write_report(runs, page)
        except CompareError:
            continue  # not comparable (or, alone: not complete): no page of that kind
        names.append(page.name)
        break
    (into / "summary.md").write_text(finished_run_markdown(run), "utf-8")
    names.append("summary.md")
    if run.html_report is not None and run.html_report.is_file():
        (into / "pytest-html").mkdir()
        shutil.copy2(run.html_report, into / "pytest-html" / run.html_report.name)
        names.append(f"pytest-html/{run.html_report.name}")
    return names
