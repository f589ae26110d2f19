"""Decoders: scenario -> rollout (one output per assistant message).

``reference`` generates every turn with ``model.generate`` (the ground truth for exactness);
``fast`` scores the teacher-forced conversation in one forward pass and generates only where
the model would not reproduce the truth; ``replay`` re-reads an earlier run's predictions.
Either model path decodes with the true history (teacher-forced) or the model's own
(free-running, ``history="model"``). Heavy modules (torch, transformers) are imported by the
decoders themselves, lazily.
"""

from __future__ import annotations

from pytest_memeval.core.history import HISTORY_TRUTH
from pytest_memeval.decode._types import Decoder
from pytest_memeval.decode.fast import CalibrationStore, FastDecoder
from pytest_memeval.decode.reference import ReferenceDecoder
from pytest_memeval.model.loading import LoadedModel

__all__ = ["Decoder", "make_model_decoder"]


def make_model_decoder(
    path: str,
    loaded: LoadedModel,
    max_new_tokens: int,
    history: str = HISTORY_TRUTH,
    store: CalibrationStore | None = None,
) -> Decoder:
    """The decoder for ``path`` (``fast`` or ``reference``) over a loaded checkpoint, with
    ``history`` ``truth`` (teacher-forced) or ``model`` (free-running); the fast one keeps its
    calibration in ``store`` (see ``decode/fast/stored.py``)."""
    if path == "fast":
        return FastDecoder(loaded, max_new_tokens, history=history, store=store)
    return ReferenceDecoder(loaded, max_new_tokens, history=history)
