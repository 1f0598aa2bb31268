"""Experiment tracking in MLflow (optional: ``tracking.mlflow_uri``): each stage's config, headline figures and tables.

Off by default. When on, every stage (probe, features, train, sweep, stoprag, report, compare) logs one MLflow
run, named after the stage, into the experiment of its run directory (the folder's name, or
``tracking.experiment``): the resolved configuration as parameters (dotted keys: ``stopping.min_f1_share``), its
headline figures as metrics and its tables, figures and report as artifacts, under their paths in the run
directory. Tags: ``raypipe.stage`` and ``raypipe.run_dir`` (the absolute path). The sweep's Tune trials log into
the same experiment through Ray Tune's MLflow callback (:func:`raypipe.runtime.stage_main.tune_callbacks`).

The store: a local folder (MLflow's file store, created if missing) or ``file:`` URI, a ``sqlite:///`` database
(artifacts in ``mlartifacts/`` beside it), or a server's URL; other URIs go to MLflow as given.
:meth:`StageTracker.open` checks it before the stage's work: a store that cannot be written, a server that does
not answer or a missing ``mlflow`` package is one line of :class:`TrackingError`. MLflow 3 keeps its file
store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set; raypipe sets it for a
file store (``mlflow ui`` over one needs it too: docs/pipeline.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pandas as pd
import yaml
from pydantic import BaseModel

from raypipe.core.config import ConfigError, TrackingConfig

log = logging.getLogger(__name__)

MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value
MAX_PARAMS_PER_BATCH = 100  # and on the parameters of one log_batch call
MAX_METRICS_PER_BATCH = 1000
SERVER_TIMEOUT_S = 10.0


class TrackingError(ConfigError):
    """Tracking is on but cannot work; the message says why in one line."""


@dataclass(frozen=True)
class Headline:
    """What a stage logs besides its configuration: headline figures, output files or folders (under the run
    directory they keep their relative paths), and tables made for tracking alone (file name -> frame)."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    artifacts: Sequence[Path] = ()
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)


def store_uri(raw: str) -> str:
    """The URI MLflow gets: a local folder or relative database path made absolute (Tune's callbacks and later
    stages may run elsewhere), anything else as given."""
    parsed = urlparse(raw)
    if not parsed.scheme or len(parsed.scheme) == 1:  # a path (a Windows drive letter is not a scheme)
        return Path(raw).expanduser().resolve().as_uri()
    if parsed.scheme == "sqlite" and raw.startswith("sqlite:///") and raw != "sqlite:///:memory:":
        return f"sqlite:///{Path(raw.removeprefix('sqlite:///')).expanduser().resolve()}"
    return raw


def _local_store(uri: str) -> tuple[Path | None, bool]:
    """The folder a local store writes to and whether it is a file store; (None, False) for a server."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path)), True
    if parsed.scheme == "sqlite" and uri != "sqlite:///:memory:":
        return Path(uri.removeprefix("sqlite:///")).parent, False
    return None, False


def check_store(uri: str) -> None:
    """Fail now, in one line, when the store cannot be written (a local folder) or does not answer (a server)."""
    folder, file_store = _local_store(uri)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".raypipe-write-check-"):
                pass
        except OSError as exc:
            raise TrackingError(f"tracking.mlflow_uri={uri}: cannot write to {folder}: {exc.strerror or exc}") from None
        if file_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    elif urlparse(uri).scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S):
                pass
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TrackingError(f"tracking.mlflow_uri={uri}: the MLflow server does not answer ({reason})") from None


def _client(uri: str):
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise TrackingError(
            "tracking.mlflow_uri is set but MLflow is not installed: pip install 'raypipe[tracking]'"
        ) from None
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client, uri: str, name: str) -> str:
    """The experiment's id, created (artifacts beside a sqlite database) when it does not exist."""
    from mlflow.exceptions import MlflowException

    folder, file_store = _local_store(uri)
    location = (folder / "mlartifacts").as_uri() if folder is not None and not file_store else None
    try:
        found = client.get_experiment_by_name(name)
        if found is None:
            try:
                return client.create_experiment(name, artifact_location=location)
            except MlflowException:  # another stage created it meanwhile
                found = client.get_experiment_by_name(name)
                if found is None:
                    raise
    except MlflowException as exc:
        raise TrackingError(f"tracking.mlflow_uri={uri}: cannot use the MLflow experiment {name!r}: {exc}") from None
    if found.lifecycle_stage == "deleted":
        raise TrackingError(
            f"the MLflow experiment {name!r} in {uri} is deleted: restore it or set tracking.experiment"
        )
    return found.experiment_id


def run_tracking(settings: TrackingConfig, run_dir: str | Path) -> TrackingConfig:
    """The tracking of a stage that does not load the run's config (report, compare): its own settings
    (``--set tracking.mlflow_uri=...``), else those in the run's ``config.yaml``, so a tracked run stays tracked."""
    if settings.mlflow_uri is not None:
        return settings
    path = Path(run_dir) / "config.yaml"
    tree = yaml.safe_load(path.read_text()) if path.is_file() else None
    section = tree.get("tracking") if isinstance(tree, dict) else None
    if not section:
        return settings
    try:
        return TrackingConfig.model_validate(section)
    except ValueError as exc:
        raise TrackingError(f"{path}: the tracking section does not validate: {exc}") from None


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested mapping (a model dump) as dotted keys; lists and empty sections as JSON, long values cut."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_PARAM_CHARS]
    return out


def metric_key(name: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_ - . / :`` and spaces; others become ``_``)."""
    return re.sub(r"[^\w\-. /:]", "_", name)


@dataclass(frozen=True)
class StageTracker:
    """One stage's tracking: :meth:`open` before the work (checks the store), :meth:`log` after it; a no-op
    when ``tracking.mlflow_uri`` is unset."""

    stage: str
    run_dir: Path
    uri: str | None = None
    experiment: str = ""
    experiment_id: str = ""

    @classmethod
    def open(cls, settings: TrackingConfig, run_dir: str | Path, stage: str) -> StageTracker:
        run_dir = Path(run_dir)
        if settings.mlflow_uri is None:
            return cls(stage, run_dir)
        uri = store_uri(settings.mlflow_uri)
        check_store(uri)
        name = settings.experiment or run_dir.resolve().name
        return cls(stage, run_dir, uri, name, _experiment_id(_client(uri), uri, name))

    @property
    def enabled(self) -> bool:
        return self.uri is not None

    @property
    def tags(self) -> dict[str, str]:
        return {"raypipe.stage": self.stage, "raypipe.run_dir": str(self.run_dir.resolve())}

    def log(
        self, config: BaseModel | None, headline: Headline | None = None, params: Mapping[str, Any] | None = None
    ) -> str | None:
        """One MLflow run: ``config`` (and ``params``) as parameters, the headline's metrics and artifacts;
        returns its id (None when tracking is off)."""
        if not self.enabled:
            return None
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException

        client = _client(self.uri)
        headline = headline or Headline()
        values = flat_params(config.model_dump(mode="json")) if config is not None else {}
        values.update(flat_params(params or {}))
        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(k), float(v), now, 0) for k, v in headline.metrics.items() if math.isfinite(v)]
        try:
            run_id = client.create_run(self.experiment_id, run_name=self.stage, tags=self.tags).info.run_id
            params_ = [Param(k, v) for k, v in values.items()]
            for i in range(0, len(params_), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=params_[i : i + MAX_PARAMS_PER_BATCH])
            for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                client.log_batch(run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])
            for path in headline.artifacts:
                self._log_artifact(client, run_id, Path(path))
            for name, frame in headline.tables.items():
                client.log_text(run_id, frame.to_csv(index=False), name)
            client.set_terminated(run_id)
        except (MlflowException, OSError) as exc:
            raise TrackingError(
                f"could not log the {self.stage} stage to MLflow at {self.uri} ({exc}); its outputs "
                f"are in {self.run_dir}"
            ) from None
        log.info("tracked %s in MLflow: experiment %r, run %s (%s)", self.stage, self.experiment, run_id, self.uri)
        return run_id

    def _log_artifact(self, client, run_id: str, path: Path) -> None:
        if not path.exists():
            log.warning("tracking: %s does not exist, not logged", path)
            return
        try:
            where = path.resolve().relative_to(self.run_dir.resolve())
        except ValueError:
            where = Path(path.name)
        if path.is_dir():
            client.log_artifacts(run_id, str(path), where.as_posix())
        else:
            client.log_artifact(run_id, str(path), where.parent.as_posix() if where.parent != Path(".") else None)
