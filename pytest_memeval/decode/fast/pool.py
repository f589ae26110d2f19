"""The pool: forward batches held, with the caches of their pending turns, until those turns
are settled together (a step of ``generate`` or of the exact stage costs about the same for 4
rows as for 64, so turns of consecutive batches are settled in one go).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_memeval.decode.fast.forward import ForwardDecisions
from pytest_memeval.decode.fast.plan import ScenarioPlan

__all__ = ["HeldBatch", "Planned", "Pool"]


@dataclass(frozen=True)
class Planned:
    """A scenario's place in the ``decode`` call, and its plan."""

    position: int
    plan: ScenarioPlan


@dataclass(frozen=True)
class HeldBatch:
    """A forward batch whose pending turns wait in the pool to be settled (its cache is
    kept, through them, until they are)."""

    planned: list[Planned]
    decided: ForwardDecisions


class Pool:
    """Forward batches held until their pending turns are settled."""

    def __init__(self) -> None:
        self.batches: list[HeldBatch] = []
        #: pending turns held, and padded tokens of the batches holding them
        self.turns = 0
        self.tokens = 0

    def add(self, planned: list[Planned], decided: ForwardDecisions) -> None:
        self.batches.append(HeldBatch(planned, decided))
        self.turns += len(decided.pending)
        self.tokens += len(planned) * max(len(p.plan.full) for p in planned)

    def take(self) -> list[HeldBatch]:
        """The batches held, leaving the pool empty."""
        batches, self.batches, self.turns, self.tokens = self.batches, [], 0, 0
        return batches
