"""Build the configured engine, and describe it for the run's record.

``build_engine`` is synchronous and blocks until the engine serves (vLLM: 20-35 s on CPU, more on a
first start that compiles); call it from an actor's constructor or a script's main, not from inside a
running event loop's hot path. Backends are imported lazily, so the HTTP backend needs no vLLM or torch.
"""

from __future__ import annotations

from typing import Any

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


def supports_regex(engine: Engine) -> bool:
    """Whether the engine honours ``GenerationRequest.regex`` (structured outputs)."""
    return bool(getattr(engine, "supports_regex", False))


def engine_info(engine: Engine) -> dict[str, Any]:
    """What the run's config records about the engine that produced it."""
    config: EngineConfig | None = getattr(engine, "config", None)
    path = getattr(engine, "model_path", None)
    info: dict[str, Any] = {
        "backend": config.backend if config else type(engine).__name__,
        "model": config.model if config else None,
        "model_path": str(path) if path else None,
        "dtype": getattr(engine, "dtype", config.dtype if config else None),  # resolved (auto -> what loaded)
        "max_model_len": engine.max_model_len,
        "supports_regex": supports_regex(engine),
        "start_seconds": round(float(getattr(engine, "start_seconds", 0.0)), 2),
    }
    if config and config.backend == "vllm":
        info.update(
            block_size=getattr(engine, "block_size", config.block_size),
            enable_prefix_caching=config.enable_prefix_caching,
            structured_outputs_backend=config.structured_outputs_backend,
            enforce_eager=config.enforce_eager,
        )
    if config and config.backend == "openai":
        info.update(base_url=config.base_url, served_model=getattr(engine, "model", None))
    return info
