"""What the stages of one fast decoder share: the model, the token budget, the bounds their
decisions are read with, and the counters they add to.

:class:`Shared` is made once per :class:`~.decoder.FastDecoder` and handed to every stage;
:class:`Stage` is the base of the stage classes (``Planner``, ``ForwardStage``,
``Verifier``, ``Generator``, ``Calibrator``), which read it as their own attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_memeval.decode.fast.bounds import Bounds
from pytest_memeval.decode.fast.stats import DecodeStats, StageSeconds
from pytest_memeval.model.loading import LoadedModel

__all__ = ["Shared", "Stage"]


@dataclass(frozen=True)
class Shared:
    """What every stage of one decoder reads (``bounds``) or adds to (``stats``,
    ``seconds``)."""

    loaded: LoadedModel
    max_new_tokens: int
    bounds: Bounds
    stats: DecodeStats
    seconds: StageSeconds
    #: the ids that end a turn (the reference's: ``loaded.stop_ids``)
    stop: frozenset[int]

    @classmethod
    def new(cls, loaded: LoadedModel, max_new_tokens: int, bounds: Bounds) -> Shared:
        """Fresh counters for a new decoder."""
        stop = frozenset(loaded.stop_ids)
        return cls(loaded, max_new_tokens, bounds, DecodeStats(), StageSeconds(), stop)


class Stage:
    """A stage of one decoder: the shared objects as its own attributes (the same objects,
    so what a stage adds to ``stats`` every stage sees; plain attributes, read in the
    stages' per-position loops)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.loaded = shared.loaded
        self.max_new_tokens = shared.max_new_tokens
        self.bounds = shared.bounds
        self.stats = shared.stats
        self.seconds = shared.seconds
        self.stop = shared.stop
