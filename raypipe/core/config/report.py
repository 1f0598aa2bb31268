"""The ``report`` section: the trajectory analysis and the report."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypipe.core.config.base import StrictModel

# Multiple-testing corrections of the paired tests (raypipe.analysis.paired.adjust_pvalues implements them).
Correction = Literal["holm", "bh"]


class ReportConfig(StrictModel):
    """Options of the trajectory analysis and the report (``jobs/report.py``)."""

    epsilon: float = Field(
        default=1e-6,
        ge=0,
        description="|U| below this counts as zero utility. F1 moves in steps far above 1e-6 for answers of "
        "realistic length, so the default only absorbs float rounding: 'zero' means the quality did not change.",
    )
    bootstrap_samples: int = Field(default=1000, ge=1, description="Bootstrap resamples of the questions.")
    bootstrap_seed: int = Field(default=0, description="Fixed seed: the same run gives the same intervals.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Width of the percentile intervals.")
    max_table_rows: int = Field(default=50, ge=1, description="Rows shown of each CSV table found in a stage folder.")
    correction: Correction = Field(
        default="holm",
        description="Multiple-testing correction of the paired tests (stopping policies against natural stopping in "
        "the sweep's and Stop-RAG's tables, runs against a baseline in raypipe compare): holm (Holm's step-down, the "
        "family-wise error rate) or bh (Benjamini-Hochberg, the false discovery rate).",
    )
    policy_pairs: bool = Field(
        default=False,
        description="Also test every pair of stopping policies against each other (the sweep's and Stop-RAG's "
        "significance tables), in the same correction families as the tests against natural stopping.",
    )
