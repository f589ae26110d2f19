"""What ``memeval slurm submit`` submits: the sbatch settings and the :class:`Plan`.

The plan is everything the batch scripts are generated from and what ``submission.json``
keeps of a submission; :func:`make_plan` makes it from the command line over the project's
``[tool.memeval.slurm]`` defaults (:func:`load_settings`), checked before anything is written.
Also the names of the files a submission keeps in ``DIR/slurm/``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pytest_memeval.core.history import HISTORY_MODEL, HISTORY_TRUTH, RUN_DIR_SUFFIX
from pytest_memeval.core.profiles import ProfileError, memeval_table, read_toml, resolve_profile
from pytest_memeval.core.sharding import shard_dir_name
from pytest_memeval.tools.slurm.jobs import SlurmError

__all__ = [
    "MERGE_SCRIPT",
    "SHARDS_SCRIPT",
    "SLURM_DIR",
    "SUBMISSION",
    "Plan",
    "SlurmDefaults",
    "SlurmSettings",
    "load_settings",
    "make_plan",
]

SLURM_DIR = "slurm"
SUBMISSION = "submission.json"
SHARDS_SCRIPT = "shards.sbatch"
MERGE_SCRIPT = "merge.sbatch"
_SETTINGS_KEYS = {"partition", "time", "account", "sbatch_args", "gpus_per_shard"}


@dataclass(frozen=True)
class SlurmSettings:
    """sbatch options for both jobs; defaults come from ``[tool.memeval.slurm]``."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()

    def header_lines(self) -> list[str]:
        """``#SBATCH`` lines for these options."""
        lines = []
        for key in ("partition", "time", "account"):
            value = getattr(self, key)
            if value:
                lines.append(f"#SBATCH --{key}={value}")
        lines += [f"#SBATCH {arg}" for arg in self.sbatch_args]
        return lines


class SlurmDefaults(NamedTuple):
    """``[tool.memeval.slurm]`` of a project: sbatch defaults and ``gpus_per_shard``."""

    settings: SlurmSettings
    #: ``None`` when the table does not set it
    gpus_per_shard: int | None


def load_settings(pyproject: Path) -> SlurmDefaults:
    """``[tool.memeval.slurm]`` of ``pyproject``: sbatch defaults and ``gpus_per_shard``."""
    table = memeval_table(pyproject, "slurm")
    where = f"{pyproject}: [tool.memeval.slurm]"
    unknown = set(table) - _SETTINGS_KEYS
    if unknown:
        raise SlurmError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_SETTINGS_KEYS)})"
        )
    for key in ("partition", "time", "account"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise SlurmError(f"{where}: {key!r} must be a non-empty string")
    extra = table.get("sbatch_args", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) and a for a in extra):
        raise SlurmError(f"{where}: 'sbatch_args' must be a list of strings, e.g. ['--qos=high']")
    gpus = table.get("gpus_per_shard")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise SlurmError(f"{where}: 'gpus_per_shard' must be an integer >= 0")
    settings = SlurmSettings(
        partition=table.get("partition"),
        time=table.get("time"),
        account=table.get("account"),
        sbatch_args=tuple(extra),
    )
    return SlurmDefaults(settings=settings, gpus_per_shard=gpus)


@dataclass(frozen=True)
class Plan:
    """What ``submit`` submits: everything the scripts are generated from."""

    ckpt: str
    shards: int
    gpus_per_shard: int
    out: Path
    project: Path
    python: str
    settings: SlurmSettings = field(default_factory=SlurmSettings)
    #: the prompts' history: ``truth`` (teacher-forced) or ``model`` (free-running)
    history: str = HISTORY_TRUTH

    @property
    def slurm_dir(self) -> Path:
        """``DIR/slurm``: the scripts, the submission record and the logs."""
        return self.out / SLURM_DIR

    def shard_dir(self, k: int) -> Path:
        """Shard ``k``'s run directory, ``DIR/shard-K-of-N``."""
        return self.out / shard_dir_name(k, self.shards)

    def shard_log(self, k: int, job_id: str) -> Path:
        """The log of shard ``k``'s task in array job ``job_id``."""
        return self.slurm_dir / "logs" / f"shard-{k}-of-{self.shards}.job-{job_id}.log"

    def merge_log(self, job_id: str) -> Path:
        """The log of merge job ``job_id``."""
        return self.slurm_dir / "logs" / f"merge.job-{job_id}.log"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data for ``submission.json``."""
        return {
            "ckpt": self.ckpt,
            "shards": self.shards,
            "gpus_per_shard": self.gpus_per_shard,
            "out": str(self.out),
            "project": str(self.project),
            "python": self.python,
            "history": self.history,
            "sbatch": {
                "partition": self.settings.partition,
                "time": self.settings.time,
                "account": self.settings.account,
                "sbatch_args": list(self.settings.sbatch_args),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan :meth:`as_dict` wrote."""
        sb = data.get("sbatch") or {}
        return cls(
            ckpt=str(data["ckpt"]),
            shards=int(data["shards"]),
            gpus_per_shard=int(data["gpus_per_shard"]),
            out=Path(data["out"]),
            project=Path(data["project"]),
            python=str(data["python"]),
            # a submission recorded before free-running runs existed was teacher-forced
            history=str(data.get("history", HISTORY_TRUTH)),
            settings=SlurmSettings(
                partition=sb.get("partition"),
                time=sb.get("time"),
                account=sb.get("account"),
                sbatch_args=tuple(sb.get("sbatch_args") or ()),
            ),
        )


def _check_path(path: Path) -> None:
    if "%" in str(path) or '"' in str(path) or "\n" in str(path):
        raise SlurmError(
            f"{path}: Slurm log paths cannot hold '%', '\"' or a newline; choose another --out"
        )


class ProjectDefaults(NamedTuple):
    """Where pytest would take a project's profiles from and put its runs."""

    profiles: Path
    runs: str


def _project_defaults(project: Path) -> ProjectDefaults:
    """``(profiles file, runs parent)`` as pytest would take them from the project's pyproject."""
    pyproject = project / "pyproject.toml"
    try:
        data = read_toml(pyproject)
    except ProfileError as exc:
        raise SlurmError(str(exc)) from None
    ini: dict[str, Any] = data.get("tool", {}).get("pytest", {}).get("ini_options", {}) or {}
    profiles = ini.get("memeval_profiles")
    return ProjectDefaults(
        profiles=(project / profiles if profiles else pyproject),
        runs=str(ini.get("memeval_out", "runs")),
    )


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``submit``: the command line over ``[tool.memeval.slurm]``, checked."""
    project = Path(args.project).resolve()
    if not project.is_dir():
        raise SlurmError(f"--project {project}: not a directory")
    defaults = _project_defaults(project)
    try:
        resolve_profile(args.ckpt, defaults.profiles)
    except ProfileError as exc:
        raise SlurmError(str(exc)) from None
    table = load_settings(project / "pyproject.toml")
    settings = SlurmSettings(
        partition=args.partition or table.settings.partition,
        time=args.time or table.settings.time,
        account=args.account or table.settings.account,
        sbatch_args=table.settings.sbatch_args + tuple(args.sbatch_arg or ()),
    )
    gpus = args.gpus_per_shard if args.gpus_per_shard is not None else (table.gpus_per_shard or 0)
    if gpus < 0:
        raise SlurmError(f"--gpus-per-shard {gpus}: must be >= 0 (0: CPU)")
    if args.shards < 1:
        raise SlurmError(f"--shards {args.shards}: must be at least 1")
    history = getattr(args, "history", HISTORY_TRUTH)
    name = args.ckpt + (RUN_DIR_SUFFIX if history == HISTORY_MODEL else "")
    out = Path(args.out).resolve() if args.out else (project / defaults.runs / name).resolve()
    _check_path(out)
    return Plan(
        ckpt=args.ckpt,
        shards=args.shards,
        gpus_per_shard=gpus,
        out=out,
        project=project,
        python=sys.executable,
        settings=settings,
        history=history,
    )
