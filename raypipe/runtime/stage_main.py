"""The ``main()`` of every stage that works on an existing run directory (features, train, sweep, stoprag).

One skeleton: parse (``--config``, ``--set``, ``-v``, ``RUN_DIR``, the stage's own flags, ``--train-run``
where the stage takes one), logging, the run's config (its own ``config.yaml`` unless ``--config`` names
another), the training run, Ray started once and always stopped, the run directory checked from every node
(:mod:`raypipe.runtime.shared_storage`), the stage's expected errors turned into
one ``error: ...`` line, and the resolved config written next to the outputs.

Tracking (``tracking.mlflow_uri``, :mod:`raypipe.analysis.tracking`): the store is checked before the work
starts, and after it the stage's run is logged: the resolved config, the written ``<stage>.yaml`` and what
the stage's ``headline`` hook returns from its result (headline figures, tables, files). A store that fails
only then is a warning (:func:`log_finished`): the stage's outputs are written, so the stage has not failed.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from raypipe.analysis.tracking import Headline, StageTracker, TrackingError
from raypipe.core.config import ConfigError, RunConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError, model_notes
from raypipe.core.train_run import add_train_run_argument, resolve_train_run
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.shared_storage import SharedPath, SharedStorageError, check_shared_storage
from raypipe.runtime.trainer import is_uri

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class StageRun:
    """What a stage's body gets: the parsed arguments, the run directory, its config and training run."""

    args: argparse.Namespace
    run: RunDir
    config: RunConfig
    train_run: RunDir | None = None
    tracker: StageTracker | None = None  # set by RunDirStage.main (disabled when tracking is off)


@dataclass(frozen=True)
class RunDirStage:
    """How one run-directory stage is started: its name (the config file it writes), its ``--help`` text,
    the flags it adds, and what it needs of Ray."""

    name: str
    description: str
    run_dir_help: str
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    train_run: bool = False
    log_to_driver: bool = False
    errors: tuple[type[BaseException], ...] = (RunDirError, ConfigError, ValueError)
    check: Callable[[StageRun], None] | None = None  # input checks before Ray starts (errors: as above)
    headline: Callable[[RunDir, Any], Headline] | None = None  # what tracking logs of the body's result

    def main(self, body: Callable[[StageRun], T], argv: list[str] | None = None) -> tuple[StageRun, T]:
        """Run ``body`` inside the skeleton; returns its result for the stage to print."""
        parser = job_parser(self.description)
        parser.add_argument("run_dir", metavar="RUN_DIR", help=self.run_dir_help)
        if self.arguments is not None:
            self.arguments(parser)
        if self.train_run:
            add_train_run_argument(parser)
        args = parser.parse_args(argv)
        setup_logging(args.verbose)
        run = RunDir(args.run_dir)
        if not run.path.is_dir():
            raise SystemExit(f"error: run directory {run.path} does not exist")
        config = run_config_from_args(args, run.path)
        tracker = tracking_or_exit(StageTracker.open, config.tracking, run.path, self.name)
        train_run = resolve_train_run(config, args.train_run, run) if self.train_run else None
        stage = StageRun(args, run, config, train_run, tracker)
        if self.check is not None:
            self._guarded(self.check, stage)

        import ray

        init_ray(config, log_to_driver=self.log_to_driver)
        try:
            self._guarded(check_run_dirs, stage)
            result = self._guarded(body, stage)
        finally:
            ray.shutdown()
        written = run.write_config(config, self.name)
        if tracker.enabled:
            headline = self.headline(run, result) if self.headline is not None else Headline()
            headline = Headline(headline.metrics, [*headline.artifacts, written], headline.tables)
            log_finished(tracker, config, headline)
        return stage, result

    def _guarded(self, step: Callable[[StageRun], T], stage: StageRun) -> T:
        try:
            return step(stage)
        except (*self.errors, SharedStorageError) as exc:  # the pre-flight's line, from any stage
            raise SystemExit(f"error: {exc}") from None


def check_run_dirs(stage: StageRun) -> None:
    """Every node sees the run directory (and the training run, and ``ray.storage_path`` where it is a path, not
    a URI), or :class:`SharedStorageError` before any work (:mod:`raypipe.runtime.shared_storage`)."""
    check_shared_storage(shared_paths(stage.run, stage.train_run, stage.config.ray.storage_path))


def shared_paths(run: RunDir, train_run: RunDir | None, storage_path: str | None) -> list[SharedPath]:
    """The folders a run-directory stage needs on every node (:func:`check_run_dirs`)."""
    paths = [SharedPath("run directory", run.path, "RUN_DIR")]
    if train_run is not None and train_run.path != run.path:
        paths.append(SharedPath("training run", train_run.path, "--train-run"))
    if storage_path is not None and not is_uri(storage_path):
        paths.append(SharedPath("Ray Train/Tune storage", Path(storage_path).expanduser(), "ray.storage_path"))
    return paths


def print_model_note(*runs: RunDir) -> None:
    """Under a stage's printed figures: the runs' :meth:`~raypipe.core.rundir.RunDir.model_note`, each
    distinct one once."""
    for note in model_notes(runs):
        print(f"\nnote: {note}.")


def tracking_or_exit(step: Callable[..., T], *args) -> T:
    """``step(*args)`` (opening a stage's tracking, before its work); a :class:`TrackingError` exits with its one
    line."""
    try:
        return step(*args)
    except TrackingError as exc:
        raise SystemExit(f"error: {exc}") from None


def log_finished(tracker: StageTracker, *args: Any) -> str | None:
    """``tracker.log(*args)`` after a stage's work is done and written: a :class:`TrackingError` is a warning with its
    one line (the outputs stand; the stage has not failed) and gives None."""
    try:
        return tracker.log(*args)
    except TrackingError as exc:
        log.warning("the stage finished, but tracking it failed: %s", exc)
        return None


def tune_callbacks(tracker: StageTracker | None) -> list:
    """Ray Tune's MLflow logger into the stage's experiment (an MLflow run per trial, tagged
    ``raypipe.stage=<stage>-trial``); none when tracking is off."""
    if tracker is None or not tracker.enabled:
        return []
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    tags = {**tracker.tags, "raypipe.stage": f"{tracker.stage}-trial"}
    return [MLflowLoggerCallback(tracking_uri=tracker.uri, experiment_name=tracker.experiment, tags=tags)]
