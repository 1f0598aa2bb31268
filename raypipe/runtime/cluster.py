"""Joining or starting Ray, where the current process runs, and where logs go: one place for every job.

Off ``-v`` the probe job keeps the terminal for raypipe's own lines and warnings (docs/engine.md, "What the
terminal shows"): the driver does not relay its workers' output (``init_ray(log_to_driver=False)``), a
generation actor sends its process's output to a file in the run's ``logs/`` (:func:`send_output_to`), and
the driver's own third-party INFO lines (Ray, Ray Data, FAISS, ...) go to ``logs/driver.log`` and
``logs/ray_data.log`` (:func:`route_driver_logs`, :func:`route_ray_data_logs`). Errors still reach the
terminal: Ray raises an actor's exception in the driver and prints a worker's death there.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from raypipe.core.config import RunConfig

RAY_DATA_LOG = "ray_data.log"
RAY_DATA_HANDLER = "raypipe-run-log"  # the file handler's name: a later run's replaces it
DRIVER_LOG = "driver.log"
DRIVER_HANDLER = "raypipe-driver-log"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NODE_LOSS_RERUNS = 2  # reruns of a step that a lost node ended (rerun_on_node_loss)
T = TypeVar("T")
log = logging.getLogger(__name__)


# Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the node has it in a worker that asked for no GPU (ray-project/ray
# #54868), so a CPU actor on a GPU node (retrieval, features, encoding) would put its models on a GPU it was not
# given. This switch, read by each worker (ray._private.utils.set_visible_accelerator_ids), restores hiding them.
HIDE_UNASKED_GPUS = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


# Ray Train's placement-group cleaner asks the State API once a second whether the training's controller lives; a
# Ray started here has no dashboard, which serves that API, so it warns once a second for the whole training
# (3,164 lines in a 53-minute tune-agent run). Its clean-up is for a crashed controller on a lasting cluster;
# a Ray that ends with its driver removes everything anyway.
PG_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_local_ray_workers() -> None:
    """The worker process setup hook of a Ray started here (:func:`init_ray`): the cleaner's warnings off."""
    logging.getLogger(PG_CLEANER_LOGGER).setLevel(logging.ERROR)


def job_runtime_env() -> dict:
    """The runtime environment of every job's workers: GPUs hidden (``CUDA_VISIBLE_DEVICES=""``) from tasks and
    actors that asked for none, unless the job's environment already sets :data:`HIDE_UNASKED_GPUS` itself."""
    return {} if HIDE_UNASKED_GPUS in os.environ else {"env_vars": {HIDE_UNASKED_GPUS: "1"}}


def init_ray(config: RunConfig, log_to_driver: bool = True) -> None:
    """Connect to ``ray.address`` (or ``RAY_ADDRESS``, set by ``ray job submit``), else start a local Ray (without
    its dashboard, its workers set up by :func:`quiet_local_ray_workers`); either way with :func:`job_runtime_env`.

    A cluster's resources are its own: ``ray.num_cpus`` only sizes a Ray started here.
    """
    import ray

    if ray.is_initialized():
        return
    if config.ray.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=config.ray.address, log_to_driver=log_to_driver, runtime_env=job_runtime_env())
    else:
        ray.init(
            num_cpus=config.ray.num_cpus,
            include_dashboard=False,
            log_to_driver=log_to_driver,
            runtime_env={
                **job_runtime_env(),
                "worker_process_setup_hook": f"{__name__}.{quiet_local_ray_workers.__name__}",
            },
        )


def rerun_on_node_loss(step: Callable[[], T], what: str, reruns: int = NODE_LOSS_RERUNS) -> T:
    """``step()``, run again (at most ``reruns`` times) when it fails while a node that was alive at its start
    is gone (a spot preemption): Ray Data restarts its map actors on a lost node, but not its internal ones (the
    Parquet footer readers, shuffle aggregators), so a lost node ends the whole pipeline. ``step`` must be
    idempotent (write to a temporary place, then move). Any other failure is raised as it is."""
    import ray

    for attempt in range(reruns + 1):
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        try:
            return step()
        except Exception as exc:
            lost = alive - {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            if not lost or attempt == reruns:
                raise
            log.warning(
                "%s failed after %d node(s) were lost (%s: %s); running it again (%d of %d)",
                what,
                len(lost),
                type(exc).__name__,
                str(exc).splitlines()[0][:200],
                attempt + 1,
                reruns,
            )
    raise AssertionError("unreachable")


def current_node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray): recorded to show where actors were placed."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def current_actor_id() -> str | None:
    """The Ray actor this process runs (None in a driver or outside Ray); a restarted actor keeps it."""
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None


def send_output_to(path: str | Path) -> bool:
    """Send this process's stdout and stderr to ``path`` (appended) at the file-descriptor level, so the
    processes it starts (vLLM's engine core) and C libraries write there too. False, leaving both as they
    were, when ``path`` cannot be opened (a node where the run directory cannot be made)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return False
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)  # a crash loses no line
    return True


def route_driver_logs(
    log_dir: Path, logger: logging.Logger | None = None, ray_logger: logging.Logger | None = None
) -> Path:
    """Write the driver's log records (every logger's, INFO and up) to ``log_dir/driver.log`` too, and
    keep Ray's own INFO lines ("Started a local Ray instance") and its :class:`NoActionNotices` off the
    terminal: they go only there.
    ``logger`` defaults to the root logger, ``ray_logger`` to Ray's (which does not propagate to it).
    The console's third-party INFO lines are held back by :func:`raypipe.core.jobargs.setup_logging`."""
    if logger is None:
        logger = logging.getLogger()
    if ray_logger is None:
        import ray  # noqa: F401  (its import installs the handler adjusted here)

        ray_logger = logging.getLogger("ray")
    path = Path(log_dir) / DRIVER_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    for target in (logger, ray_logger):  # a handler each: ray.init sets its own format on the ray logger's
        _replace_file_handler(target, _file_handler(path, DRIVER_HANDLER))
    for console in _console_handlers(ray_logger):
        console.setLevel(max(console.level, logging.WARNING))
        if not any(isinstance(f, NoActionNotices) for f in console.filters):
            console.addFilter(NoActionNotices())
    return path


class NoActionNotices(logging.Filter):
    """Ray's WARNING records that ask nothing of the user: that Ray turned token authentication on for the
    local cluster it starts (the safe default; the opposite notice, that it is off, still shows)."""

    PREFIXES = ("Token authentication is enabled for this Ray cluster",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.PREFIXES)


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
    for console in _console_handlers(logger):
        console.setLevel(max(console.level, logging.WARNING))
    path = Path(log_dir) / RAY_DATA_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_file_handler(logger, _file_handler(path, RAY_DATA_HANDLER))
    return path


def _file_handler(path: Path, name: str) -> logging.FileHandler:
    handler = logging.FileHandler(path)
    handler.set_name(name)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler


def _replace_file_handler(logger: logging.Logger, handler: logging.FileHandler) -> None:
    """Add ``handler`` to ``logger`` in place of the one of the same name a previous run added."""
    for old in list(logger.handlers):
        if old.get_name() == handler.get_name():
            logger.removeHandler(old)
            old.close()
    logger.addHandler(handler)


def _console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [
        h for h in logger.handlers if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
