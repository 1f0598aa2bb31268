"""The ``generation`` section: the generation actors."""

from __future__ import annotations

from pydantic import Field

from raypipe.core.config.base import StrictModel


class GenerationConfig(StrictModel):
    actors: int = Field(default=1, ge=1, description="Generation actors, each holding one engine.")
    actor_num_cpus: float = Field(default=0.5, ge=0)
    actor_num_gpus: float = Field(default=0.0, ge=0)
    max_concurrent_trajectories: int = Field(default=64, ge=1, description="Trajectories in flight per engine.")
    batch_size: int = Field(
        default=8, ge=1, description="Questions per map_batches batch: one output part each, written when all are done."
    )
    batches_per_actor: int = Field(
        default=8,
        ge=1,
        description="Batches an actor works on at once; batch_size x batches_per_actor should reach "
        "max_concurrent_trajectories, so the engine stays full while a batch finishes its tail.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per generation actor, e.g. {raypipe_generation: 1}."
    )
    max_question_crashes: int = Field(
        default=2,
        ge=1,
        description="Engine or actor deaths a question may be in flight for before it runs alone; if it kills its "
        "engine alone too, its row is written with stop_reason engine_crash (docs/reliability.md).",
    )
    max_actor_restarts: int = Field(
        default=100,
        ge=0,
        description="Ray restarts of one generation actor, and Ray retries of one batch, before the job fails: "
        "a backstop for deaths no question is charged with (max_question_crashes bounds the others).",
    )
    retry_transient: bool = Field(
        default=True,
        description="A rerun into the same run directory runs again the questions whose row ended for a passing "
        "reason (engine_error, retrieval_error: an outage, not the question); the new row replaces the old one, "
        "which is removed once the rerun's engine and retrieval answer. A question's own failures (internal_error, "
        "query_crash, engine_crash, ...) stay. false (probe --no-retry): keep them as written.",
    )
