"""The ``ray`` section: the Ray cluster a job joins or starts."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from raypipe.core.config.base import StrictModel


class RayConfig(StrictModel):
    address: str | None = Field(default=None, description="None: connect to RAY_ADDRESS or start a local Ray.")
    num_cpus: int | None = Field(default=None, ge=1, description="Only when starting a local Ray.")
    storage_path: str | None = Field(
        default=None,
        description="Where Ray Train (cross-encoders, the Stop-RAG Q-network) and Ray Tune (the sweep) keep their "
        "runs: None = inside the run directory (one machine, or a run directory on a shared mount); else a "
        "folder every node mounts (e.g. /mnt/raypipe/train) or an s3:// / gs:// URI, under which each run "
        "directory gets <run name>/<stage folder>. Never a folder on the head's local disk on a multi-node cluster.",
    )

    @model_validator(mode="after")
    def _storage_is_absolute(self) -> RayConfig:
        path = self.storage_path
        if path is not None and "://" not in path and not Path(path).expanduser().is_absolute():
            raise ValueError(
                f"ray.storage_path={path!r}: give an absolute path on a shared mount or an s3:// / gs:// URI"
            )
        return self
