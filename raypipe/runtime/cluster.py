"""Joining or starting Ray, and where the current process runs: one place for every job and stage."""

from __future__ import annotations

import os

from raypipe.core.config import RunConfig


def init_ray(config: RunConfig, log_to_driver: bool = True) -> None:
    """Connect to ``ray.address`` (or ``RAY_ADDRESS``, set by ``ray job submit``), else start a local Ray.

    A cluster's resources are its own: ``ray.num_cpus`` only sizes a Ray started here.
    """
    import ray

    if ray.is_initialized():
        return
    if config.ray.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=config.ray.address, log_to_driver=log_to_driver)
    else:
        ray.init(num_cpus=config.ray.num_cpus, include_dashboard=False, log_to_driver=log_to_driver)


def current_node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray): recorded to show where actors were placed."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
