"""Which device a worker decodes on.

Extended by the GPU binding (one device per xdist worker, assigned by the controller and
handed over in ``workerinput``); without an assignment a worker uses CUDA if present.
"""

from __future__ import annotations

import pytest

from .state import workerinput

__all__ = ["worker_device"]


def worker_device(config: pytest.Config) -> str:
    """The torch device string this process decodes on."""
    wi = workerinput(config)
    if wi is not None and wi.get("memeval_device"):
        return str(wi["memeval_device"])
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
