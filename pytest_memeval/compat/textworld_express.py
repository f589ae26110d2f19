"""TextWorld Express internals: the JVM process and the py4j gateway behind its env.

``TextWorldExpressEnv`` starts its JVM with py4j's ``launch_gateway`` and keeps the
``subprocess.Popen`` and the ``JavaGateway`` only on its private ``_gateway`` (the process
as ``_gateway.java_process``). Its public ``close()`` asks the JVM to shut down and does not
wait for it to exit; and its ``__del__`` calls ``close()`` again whenever the garbage
collector gets to it. On a JVM that is already gone (crashed, killed) that second call makes
py4j try to reconnect and log each failure with its traceback (so do the finalizers of its
proxies of Java objects, through ``_gateway._gateway_client``), which on CPython 3.11 can run
inside another ``ast.parse`` (the collector runs anywhere) and corrupt its recursion counter:
a ``SystemError: AST constructor recursion depth mismatch`` in unrelated code later.

So closing goes through :func:`close_env`: when the JVM has exited, the client is marked
disconnected (as py4j's own shutdown marks it) and the gateway closed on the Python side
only; the env's ``close`` is made a no-op afterwards (its ``__del__`` then does nothing); and
:func:`java_process` gives the caller the process to wait for. A shutdown the JVM never
answered (it hung, and was killed) leaves the client marked connected: the caller marks it
with :func:`mark_disconnected` once the process is gone.

Checked on textworld-express 1.1.0 (the newest release) with py4j 0.10.9.9. Without the
private attributes, :func:`java_process` returns ``None`` (no wait: the JVM exits on its own,
unchecked) and :func:`close_env` falls back to the public ``close()``.
"""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["close_env", "java_process", "mark_disconnected"]


def java_process(env: object) -> subprocess.Popen[bytes] | None:
    """The JVM process of a ``textworld_express.TextWorldExpressEnv``, or ``None``."""
    gateway = getattr(env, "_gateway", None)
    process = getattr(gateway, "java_process", None)
    return process if isinstance(process, subprocess.Popen) else None


def close_env(env: Any) -> None:
    """Close ``env``'s gateway (without reaching a JVM that is gone) and disarm its ``__del__``.

    Does not wait for the JVM: the caller waits on :func:`java_process`'s process.
    """
    process = java_process(env)
    gateway = getattr(env, "_gateway", None)
    try:
        if process is not None and process.poll() is not None and gateway is not None:
            mark_disconnected(env)
            gateway.close(keep_callback_server=True)  # public: the Python side only
            gateway.shutdown_callback_server()
        else:
            env.close()
    finally:
        # an instance attribute wins over the class's method: __del__ calls self.close()
        env.close = _already_closed


def mark_disconnected(env: object) -> None:
    """Tell ``env``'s py4j client that its JVM is gone, as py4j's own successful shutdown does
    (``_gateway._gateway_client.is_connected``): the finalizers of its proxies of Java objects
    then stop trying to reach the JVM (and logging each failure with its traceback)."""
    client = getattr(getattr(env, "_gateway", None), "_gateway_client", None)
    if client is not None:
        client.is_connected = False


def _already_closed() -> None:
    """What ``close`` of a closed env does: nothing."""
