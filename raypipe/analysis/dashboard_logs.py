"""Where a run directory's TensorBoard logs are, for ``raypipe dashboard``.

Ray Tune writes event files (through tensorboardX) into every trial folder of an experiment: the sweep's
under ``RUN_DIR/stopping/tune/<experiment>/``; the training stages' Ray Train runs write theirs where they
keep their results (``RUN_DIR/models/``, ``RUN_DIR/stoprag/``) while those are kept. Each folder that holds
event files becomes one named root of the dashboard (``sweep``, ``train``, ``stoprag``).
"""

from __future__ import annotations

from pathlib import Path

EVENT_FILES = "events.out.tfevents.*"
# dashboard name -> folder under RUN_DIR
LOG_ROOTS = {"sweep": Path("stopping") / "tune", "train": Path("models"), "stoprag": Path("stoprag")}
RUN_MARKERS = ("config.yaml", "trajectories")  # what every run directory has (the probe stage writes both)


class DashboardError(ValueError):
    """A run directory without logs to show; the message says what to run."""


def log_roots(run_dir: str | Path) -> dict[str, Path]:
    """The named log folders of a run directory that hold TensorBoard event files (at any depth)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DashboardError(f"run directory {run} does not exist")
    if not any((run / marker).exists() for marker in RUN_MARKERS):
        raise DashboardError(f"{run} is not a run directory (no {' or '.join(RUN_MARKERS)})")
    roots = {name: run / rel for name, rel in LOG_ROOTS.items() if _has_events(run / rel)}
    if not roots:
        looked = ", ".join(str(run / rel) for rel in LOG_ROOTS.values())
        raise DashboardError(f"no TensorBoard logs in {run} (looked in {looked}); `raypipe sweep {run}` writes them")
    return roots


def logdir_spec(roots: dict[str, Path]) -> str:
    """TensorBoard's ``--logdir_spec``: ``name:path`` pairs, so runs show as ``sweep/<trial>``."""
    for path in roots.values():
        if "," in str(path):
            raise DashboardError(f"TensorBoard cannot read a log folder whose path has a comma: {path}")
    return ",".join(f"{name}:{path.resolve()}" for name, path in roots.items())


def _has_events(folder: Path) -> bool:
    return folder.is_dir() and next(folder.rglob(EVENT_FILES), None) is not None
