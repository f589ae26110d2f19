"""The decoder protocol, shared by every decoder (their results, :class:`Rollout` and
:class:`TurnOutput`, are records: :mod:`pytest_memeval.core.records`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pytest_memeval.core.benchmark import Scenario
from pytest_memeval.core.records import Rollout

__all__ = ["Decoder"]


class Decoder(Protocol):
    """Turns scenarios into rollouts. Implementations hold the model; one per worker."""

    path: str

    def rollout(self, scenario: Scenario) -> Rollout:
        """Decode every assistant message of ``scenario`` from its teacher-forced history."""
        ...

    def prefetch(self, scenarios: Sequence[Scenario]) -> None:
        """Hint: these scenarios come next on this worker (a decoder may batch them)."""
        ...
