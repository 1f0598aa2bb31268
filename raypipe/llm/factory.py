"""Build the configured engine.

``build_engine`` is synchronous and blocks until the engine serves (vLLM: 20-35 s on CPU, more on a
first start that compiles); call it from an actor's constructor or a script's main, not from inside a
running event loop's hot path. Backends are imported lazily, so the HTTP backend needs no vLLM or torch.
"""

from __future__ import annotations

from raypipe.core.config import EngineConfig
from raypipe.llm.base import Engine


def build_engine(config: EngineConfig) -> Engine:
    """A started engine for ``config.backend`` ("vllm", "transformers" or "openai")."""
    if config.backend == "vllm":
        from raypipe.llm.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    if config.backend == "transformers":
        from raypipe.llm.hf_engine import TransformersEngine

        return TransformersEngine(config)
    if config.backend == "openai":
        from raypipe.llm.openai_engine import OpenAIEngine

        return OpenAIEngine(config)
    raise ValueError(f"unknown engine backend {config.backend!r}")
