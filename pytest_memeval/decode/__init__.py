"""Decoders: scenario -> rollout (one output per assistant message).

``reference`` generates every turn with ``model.generate`` (the ground truth for exactness);
``fast`` scores the teacher-forced conversation in one forward pass and generates only where
the model would not reproduce the truth; ``replay`` re-reads an earlier run's predictions.
Heavy modules (torch, transformers) are imported by the decoders themselves, lazily.
"""

from __future__ import annotations

from ._types import Decoder, Rollout, TurnOutput

__all__ = ["Decoder", "Rollout", "TurnOutput"]


def make_model_decoder(path: str, loaded: object, max_new_tokens: int) -> Decoder:
    """The decoder for ``path`` (``fast`` or ``reference``) over a loaded checkpoint."""
    from ..model import LoadedModel

    assert isinstance(loaded, LoadedModel)
    if path == "fast":
        from .fast import FastDecoder

        return FastDecoder(loaded, max_new_tokens)
    from .reference import ReferenceDecoder

    return ReferenceDecoder(loaded, max_new_tokens)


__all__ += ["make_model_decoder"]
