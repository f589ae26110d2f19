"""Third-party warnings a user of the plugin cannot act on, silenced narrowly where they arise.

Each entry names the category, the message and the module that warns, and why it is noise:
a warning about how one library calls another, inside the plugin's own call (loading a model,
logging a run to MLflow), that no setting of the user's changes.
:func:`third_party_noise_filtered` ignores exactly those (all three must match) around the
calls that trigger them, and nothing else: the same warning from the user's own code, any
other warning of these libraries, and every warning elsewhere are shown as pytest shows them.
docs/ci-and-tracking.md ("Third-party warnings") lists the entries.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["THIRD_PARTY_NOISE", "Noise", "third_party_noise_filtered"]


@dataclass(frozen=True)
class Noise:
    """One warning to ignore: its category (subclasses too), a regex its message starts with,
    a regex the whole name of the module that warns must match, and why."""

    category: type[Warning]
    message: str
    module: str
    why: str


THIRD_PARTY_NOISE = (
    Noise(
        FutureWarning,
        r"`is_gradient_checkpointing` is deprecated",
        r"transformers\.modeling_utils",
        "peft's PeftModel reads the property transformers 5 deprecated while it wraps the "
        "base model (peft 0.21, transformers 5.x); the plugin never reads it, and nothing in "
        "the user's checkpoint or settings changes it",
    ),
    Noise(
        DeprecationWarning,  # SQLAlchemy's SADeprecationWarning is one
        r"The ``noload`` loader strategy is deprecated",
        r"mlflow\.store\.tracking\.sqlalchemy_store",
        "MLflow's database tracking store (mlflow 3.17) configures its mappers with a loader "
        "strategy SQLAlchemy 2.1 deprecated; it is MLflow's code, run when --memeval-mlflow "
        "logs a run",
    ),
)


@contextmanager
def third_party_noise_filtered() -> Iterator[None]:
    """Ignore the :data:`THIRD_PARTY_NOISE` warnings inside the block (warnings' filters are
    restored after it, whatever pytest or the user had set)."""
    with warnings.catch_warnings():
        for noise in THIRD_PARTY_NOISE:
            # The module must match whole (warnings matches a regex at the start only).
            warnings.filterwarnings(
                "ignore",
                message=noise.message,
                category=noise.category,
                module=noise.module + r"\Z",
            )
        yield
