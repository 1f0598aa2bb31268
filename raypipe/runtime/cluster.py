"""Joining or starting Ray, where the current process runs, and where Ray Data logs: one place for every job."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from raypipe.core.config import RunConfig

RAY_DATA_LOG = "ray_data.log"
RAY_DATA_HANDLER = "raypipe-run-log"  # the file handler's name: a later run's replaces it


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


def route_ray_data_logs(
    log_dir: Path, interactive: bool | None = None, logger: logging.Logger | None = None
) -> Path | None:
    """In a non-interactive terminal, send Ray Data's driver log (its progress: six lines every ten
    seconds) to ``log_dir/ray_data.log`` and keep only its warnings on the console, where raypipe's own
    progress line is; returns the log file (None on a TTY, where Ray Data draws progress bars).

    ``interactive`` defaults to whether stdout is a TTY; ``logger`` to the ``ray.data`` logger, which
    Ray Data configures when it is imported (so it is imported first).
    """
    if interactive is None:
        interactive = sys.stdout.isatty()
    if interactive:
        return None
    if logger is None:
        import ray.data  # noqa: F401  (its import installs the handlers adjusted here)

        logger = logging.getLogger("ray.data")
    for handler in list(logger.handlers):
        if handler.get_name() == RAY_DATA_HANDLER:
            logger.removeHandler(handler)
            handler.close()
        elif isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))
    path = Path(log_dir) / RAY_DATA_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(path)
    file_handler.set_name(RAY_DATA_HANDLER)
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(file_handler)
    return path
