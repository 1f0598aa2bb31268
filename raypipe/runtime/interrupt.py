"""Stopping an interrupted job fast: Ray's shutdown, then whatever of ours outlived it.

Measured with ``jobs/probe.py`` on 2 cores: after Ctrl-C the driver is gone in about 2 s, but when the
signal comes while a vLLM engine starts, the engine's ``VLLM::Worker`` process (a child of the EngineCore,
itself a child of a Ray worker) outlives the Ray worker by up to 10 s, holding its memory and a core.
"""

from __future__ import annotations

import contextlib


def shutdown_now(grace_s: float = 2.0) -> None:
    """``ray.shutdown()``, then SIGKILL every process this one had started (a local Ray's processes and the
    engines under them) that is still running, waiting at most ``grace_s`` for them to go."""
    import psutil
    import ray

    ours = psutil.Process().children(recursive=True)
    if ray.is_initialized():
        ray.shutdown()
    for process in ours:
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            process.kill()
    psutil.wait_procs(ours, timeout=grace_s)
