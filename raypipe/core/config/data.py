"""The ``data`` section: the questions a run asks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypipe.core.config.base import StrictModel


class DataConfig(StrictModel):
    datasets: list[str] = Field(
        default_factory=lambda: ["hotpotqa", "2wikimultihopqa", "musique"],
        description="Bundled dataset names or paths of FlashRAG-style question files.",
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        description="First N questions of each bundled dataset (the presets' quick sample); a question file given by "
        "path runs whole unless limit_files is set.",
    )
    limit_files: bool = Field(
        default=False, description="Apply limit to question files too: what --limit N sets (with data.limit=N)."
    )
    split: Literal["all", "default", "dev", "train"] = Field(
        default="all",
        description="Bundled datasets only: every question, or one part of the agent-training split (the default "
        "run's, the dev split, the training pool; docs/agent-training.md), which data.limit then cuts per dataset.",
    )
    corpus: str = Field(default="bundled", description="'bundled' or the path of a corpus jsonl.")
