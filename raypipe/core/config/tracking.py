"""The ``tracking`` section: experiment tracking."""

from __future__ import annotations

from pydantic import Field

from raypipe.core.config.base import StrictModel


class TrackingConfig(StrictModel):
    """Experiment tracking (raypipe.analysis.tracking): every stage logs its config, headline figures and tables."""

    mlflow_uri: str | None = Field(
        default=None,
        description="MLflow tracking store: a local folder (a file store, created if missing; or file:/PATH), "
        "sqlite:///PATH.db, or a server URL (http://host:5000). One MLflow experiment per run directory, one MLflow "
        "run per stage. None: off. Needs the tracking extra (pip install 'raypipe[tracking]').",
    )
    experiment: str | None = Field(
        default=None, description="MLflow experiment the stages log to; None: the run directory's folder name."
    )
