"""What each xdist worker process was given: a conftest that a pytester project installs.

Every process that starts (replacements included) writes its ``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER``, ``OMP_NUM_THREADS`` and memeval's ``workerinput`` fields to
``envs/<workerid>.json``; :func:`worker_envs` reads them back.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

RECORD_ENV = textwrap.dedent(
    """
    import json, os
    from pathlib import Path

    def pytest_configure(config):
        # Every process that starts, replacements included, says what it was given.
        wi = getattr(config, "workerinput", None)
        if wi is None:
            return
        Path("envs").mkdir(exist_ok=True)
        Path("envs", wi["workerid"] + ".json").write_text(json.dumps({
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "memeval_device": wi.get("memeval_device"),
            "memeval_torch_threads": wi.get("memeval_torch_threads"),
        }))
    """
)


def worker_envs(root: Path) -> dict[str, dict[str, object]]:
    """What each worker process of a run in ``root`` reported, by worker id (``gw0``...)."""
    return {
        p.stem: json.loads(p.read_text("utf-8")) for p in sorted((root / "envs").glob("*.json"))
    }
