"""Third-party warnings a user of the plugin cannot act on, silenced narrowly where they arise.

Each entry names the category, the message and the module that warns, and why it is noise:
a warning about how one library calls another, inside the plugin's own model loading, that no
setting of the user's changes. :func:`third_party_noise_filtered` ignores exactly those (all
three must match) around the call that triggers them, and nothing else: the same warning from
the user's own code, any other warning of these libraries, and every warning elsewhere are
shown as pytest shows them. docs/decoding.md ("Model families") lists the entries.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["THIRD_PARTY_NOISE", "Noise", "third_party_noise_filtered"]


@dataclass(frozen=True)
class Noise:
    """One warning to ignore: its category, a regex its message starts with, a regex the
    module that warns must fully match (``warnings.filterwarnings`` semantics), and why."""

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
)


@contextmanager
def third_party_noise_filtered() -> Iterator[None]:
    """Ignore the :data:`THIRD_PARTY_NOISE` warnings inside the block (warnings' filters are
    restored after it, whatever pytest or the user had set)."""
    with warnings.catch_warnings():
        for noise in THIRD_PARTY_NOISE:
            warnings.filterwarnings(
                "ignore", message=noise.message, category=noise.category, module=noise.module
            )
        yield
