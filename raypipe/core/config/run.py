"""The whole run configuration: every section, and the checks across sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from raypipe.core.config.agent import PROTOCOL_DEFAULTS, AgentConfig, fill_missing
from raypipe.core.config.agent_train import AgentTrainConfig
from raypipe.core.config.base import StrictModel
from raypipe.core.config.cluster import RayConfig
from raypipe.core.config.data import DataConfig
from raypipe.core.config.engine import EngineConfig
from raypipe.core.config.features import FeaturesConfig
from raypipe.core.config.generation import GenerationConfig
from raypipe.core.config.report import ReportConfig
from raypipe.core.config.retrieval import RetrievalConfig
from raypipe.core.config.serve_agent import ServeAgentConfig
from raypipe.core.config.stopping import StoppingConfig
from raypipe.core.config.stoprag import StopRagConfig
from raypipe.core.config.tracking import TrackingConfig
from raypipe.core.config.train import TrainConfig


class RunConfig(StrictModel):
    name: str = "embedded"
    seed: int = 0
    train_run: str | None = Field(
        default=None,
        description="Training run directory (--train-run): train, sweep and stoprag train and tune on its questions "
        "and evaluate on this run's, the seed paper's train/dev protocol; None = cross-fitting within this run.",
    )
    runs_dir: str = Field(
        default="runs",
        description="Where `raypipe probe` puts the run directory when --out is not given: <runs_dir>/<name>. On a "
        "cluster, a folder every node mounts (the GPU presets: /mnt/raypipe/runs); the later stages take the run "
        "directory as their argument.",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    retrieval: RetrievalConfig  # absent: the defaults, with the agent's top_k (_resolve_top_k)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig.model_validate({}))  # its max_turns resolved
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    stoprag: StopRagConfig = Field(default_factory=StopRagConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    stopping: StoppingConfig = Field(default_factory=StoppingConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    serve_agent: ServeAgentConfig = Field(default_factory=ServeAgentConfig)
    agent_train: AgentTrainConfig = Field(default_factory=AgentTrainConfig)

    @model_validator(mode="before")
    @classmethod
    def _resolve_top_k(cls, data: Any) -> Any:
        """A retrieval.top_k of None (or none given) becomes the agent protocol's default."""
        if not isinstance(data, dict):
            return data
        agent = data.get("agent")
        protocol = (
            agent.protocol
            if isinstance(agent, AgentConfig)
            else agent.get("protocol")
            if isinstance(agent, dict)
            else None
        )
        defaults = PROTOCOL_DEFAULTS.get(protocol or AgentConfig.model_fields["protocol"].default)
        retrieval = data.get("retrieval", {})
        return {**data, "retrieval": fill_missing(retrieval, "top_k", defaults.top_k if defaults else None)}

    @model_validator(mode="after")
    def _check_backend(self) -> RunConfig:
        if self.engine.backend == "openai" and not self.engine.base_url:
            raise ValueError("engine.backend=openai needs engine.base_url")
        return self

    @model_validator(mode="after")
    def _check_tensor_parallel_gpus(self) -> RunConfig:
        """A vLLM engine of tensor_parallel_size N in a GPU actor needs N GPUs in that actor (vLLM would fail late,
        "World size (N) is larger than the number of available GPUs"); an actor of 0 GPUs runs vLLM on CPUs."""
        tp = self.engine.tensor_parallel_size
        if self.engine.backend != "vllm" or tp == 1:
            return self
        for setting, gpus in (
            ("generation.actor_num_gpus", self.generation.actor_num_gpus),
            ("serve_agent.num_gpus", self.serve_agent.num_gpus),
        ):
            if 0 < gpus < tp:
                raise ValueError(
                    f"engine.tensor_parallel_size={tp} needs {tp} GPUs in each engine's actor, {setting}={gpus:g} "
                    f"gives it {gpus:g}: set {setting}={tp} or lower engine.tensor_parallel_size"
                )
        return self
