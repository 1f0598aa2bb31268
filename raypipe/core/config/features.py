"""The ``features`` section: trajectory signals."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypipe.core.config.base import ReasoningText, StrictModel


class FeaturesConfig(StrictModel):
    """Trajectory signals (jobs/features.py); depths and constants default to the seed paper's."""

    sentence_model: str = Field(
        default="minilm", description="SBERT model for the similarity signals (embedded name or folder)."
    )
    actors: int = Field(
        default=1, ge=1, description="Actor pool size; each actor holds the sentence encoder and the index."
    )
    actor_num_cpus: float = Field(
        default=0.5, ge=0, description="Per actor (0.5: whole-CPU pool actors stall Ray Data on 2 cores)."
    )
    batch_trajectories: int = Field(
        default=32, ge=1, description="Trajectories per map_batches batch (one encoder call each)."
    )
    partitions: int | None = Field(
        default=None,
        ge=1,
        description="Shuffle partitions of the group-by-trajectory; None: one per 5000 rows, at least actors.",
    )
    rbo_p: float = Field(default=0.99, gt=0, lt=1, description="RBO persistence, both variants.")
    rbo_missing: Literal["zero", "undefined"] = Field(
        default="zero",
        description="RBO against an empty or missing list, and the max over previous lists at the first retrieval "
        "iteration: zero (the seed's 0.0) or undefined (null).",
    )
    nqc_idf: Literal["seed", "true"] = Field(
        default="seed",
        description="Max IDF of the seed's NQC: seed = whitespace split, Porter stem without lowercasing, a term "
        "the statistics lack counts as df=1 (about log N for most queries); true = the statistics' own tokens.",
    )
    reasoning_text: ReasoningText = "parsed"
    nqc_depth: int = Field(default=100, ge=1, description="Scores in the seed paper's NQC variance.")
    nqc_k: int = Field(default=100, ge=1, description="Top-k of textbook NQC (corpus score: mean of the deep list).")
    a_pair_depth: int = Field(default=50, ge=1)
    dense_qpp_k: int = Field(default=3, ge=1)
    confidence_drop_last: int = Field(default=4, ge=0, description="Probe tokens dropped before the mean (seed: 4).")
