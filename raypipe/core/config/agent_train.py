"""The ``agent_train`` section: supervised agent trajectories and the agent's fine-tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypipe.core.config.base import StrictModel


class AgentTrainConfig(StrictModel):
    """Supervised agent trajectories (``raypipe agent-data``) and the agent's fine-tuning (``raypipe tune-agent``);
    docs/agent-training.md."""

    dev_percent: int = Field(
        default=20,
        ge=1,
        le=90,
        description="Share of the bundled questions in the dev split, chosen by a hash of each qid.",
    )
    max_searches: int = Field(
        default=3, ge=1, description="Searches a constructed trajectory may make before it is rejected."
    )
    extra_search_percent: int = Field(
        default=25,
        ge=0,
        le=100,
        description="Trajectories (by a hash of the qid) that search once more than they need before answering.",
    )
    max_tokens: int = Field(
        default=3072, ge=64, description="Tokens of a training trajectory; longer ones are left out."
    )
    method: Literal["lora", "full"] = Field(
        default="lora",
        description="lora: LoRA factors on the target layers; full: the target layers' weights themselves (saved as "
        "deltas from the base, float32: about 425 MB for the embedded model, no small artifact; a lower "
        "learning_rate, e.g. 2e-5).",
    )
    lora_rank: int = Field(default=8, ge=1, description="Rank of the LoRA factors.")
    lora_alpha: float = Field(default=16.0, gt=0, description="LoRA scale = alpha / rank.")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Linear layers (by name suffix) that get a LoRA adapter (method full: that are trained).",
    )
    lora_layers: int | None = Field(
        default=None, ge=1, description="Adapt (or train) only the top N decoder layers; None: every layer."
    )
    init_adapter: str | None = Field(
        default=None,
        description="Start from this artifact's tensors (a bundled name or a folder; same method, targets and rank): "
        "a second round, e.g. on the tuned agent's own successful trajectories; None: new factors.",
    )
    epochs: int = Field(default=1, ge=1, description="Passes over the trajectories.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps (None: all epochs)."
    )
    learning_rate: float = Field(default=2e-4, gt=0, description="AdamW learning rate (constant).")
    grad_accum: int = Field(default=4, ge=1, description="Trajectories per optimizer step (per worker; one at a time).")
    checkpoint_steps: int = Field(default=25, ge=1, description="Optimizer steps between checkpoints (resume points).")
    num_workers: int = Field(default=1, ge=1, description="Ray Train workers.")
    cpus_per_worker: float = Field(default=2.0, gt=0)
    threads: int = Field(default=0, ge=0, description="torch threads per worker; 0: torch's default.")
    use_gpu: bool = Field(default=False, description="One GPU per Ray Train worker (a cluster); false: CPU workers.")
