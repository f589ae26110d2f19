"""TextWorld Express internals: the JVM process behind a ``TextWorldExpressEnv``.

``TextWorldExpressEnv`` starts its JVM with py4j's ``launch_gateway`` and keeps the
``subprocess.Popen`` only on its private ``_gateway.java_process``; its public ``close()``
shuts the gateway down and writes a newline to the JVM's stdin (which makes it exit) but does
not wait for the exit. To close an environment with no JVM left behind, the backend needs
that process: :func:`java_process` is the one place that reads it.

Checked on textworld-express 1.1.0 (the newest release) with py4j 0.10.9.9. Without the
attribute, :func:`java_process` returns ``None`` and closing falls back to ``close()`` alone
(the JVM still exits on its own, unchecked).
"""

from __future__ import annotations

import subprocess

__all__ = ["java_process"]


def java_process(env: object) -> subprocess.Popen[bytes] | None:
    """The JVM process of a ``textworld_express.TextWorldExpressEnv``, or ``None``."""
    gateway = getattr(env, "_gateway", None)
    process = getattr(gateway, "java_process", None)
    return process if isinstance(process, subprocess.Popen) else None
