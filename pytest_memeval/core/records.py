"""Plain-data records that flow between the stages: decoder outputs (:class:`TurnOutput`,
:class:`Rollout`).

They carry no behaviour and import nothing heavy, so every stage (scoring in ``core``, the
decoders, the runtime) can share them without depending on one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Rollout", "TurnOutput"]


@dataclass(frozen=True)
class TurnOutput:
    """What the model produced for one assistant message.

    ``text`` is the decoded output without the stop token; ``stopped`` is False when
    generation ran into ``max_new_tokens`` (a parse failure), and ``None`` when it is not
    known (replayed predictions of another harness, which records no stop flags);
    ``generated`` is True when the output came from a real ``generate`` call rather than a
    teacher-forced check.
    """

    text: str
    stopped: bool | None
    generated: bool = True


@dataclass(frozen=True)
class Rollout:
    """One output per assistant message of a scenario, in order; the last is the final answer."""

    outputs: tuple[TurnOutput, ...]
    path: str
    prompt_tail: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: scenarios in the forward pass that decoded this one, and the decoder's most per pass
    #: (0, 0: not decoded by a batched pass, e.g. the reference path)
    batch: int = 0
    batch_size: int = 0
