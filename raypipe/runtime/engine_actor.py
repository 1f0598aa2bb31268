"""One engine in a Ray actor placed like a probe generation actor, and the :class:`Engine` a driver calls it by.

A stage whose domain code takes an engine (Stop-RAG's LLM-Stop baseline and its ``generator`` rewards) must
not build it in the driver: on a cluster the driver runs on the head, which has no GPU (vLLM's CUDA build
fails there with "Failed to infer device type"). :func:`actor_engine_factory` gives such a stage an engine
factory whose engine lives in an :class:`EngineHost` actor that asks for ``generation.actor_num_cpus`` /
``actor_num_gpus`` / ``resources``, one engine per actor, as the probe job's generation actors do (on one
machine with the CPU defaults it runs on the CPU, as theirs do). The driver gets an :class:`ActorEngine`,
which forwards every call of the :class:`~raypipe.llm.base.Engine` protocol to the actor; closing it ends
the actor. Up to ``generation.max_concurrent_trajectories`` requests are in flight on the actor at once.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

from raypipe.core.config import EngineConfig, GenerationConfig
from raypipe.core.loopthread import LoopThread
from raypipe.llm.base import Engine, Generation, GenerationRequest
from raypipe.llm.factory import build_engine
from raypipe.runtime.cluster import current_node_id


class EngineHost:
    """The actor's body: ``engine_factory(config)`` (default :func:`build_engine`) built in the actor's process,
    its coroutines run on one event loop thread, which the actor's request threads submit to."""

    def __init__(self, config: dict[str, Any], engine_factory: Callable[[EngineConfig], Engine] | None = None):
        import ray

        self._thread = LoopThread("raypipe-engine")
        engine = (engine_factory or build_engine)(EngineConfig.model_validate(config))
        if inspect.isawaitable(engine):
            engine = self._thread.run(engine)
        self.engine: Engine = engine
        self.placement = {
            "node_id": current_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def info(self) -> dict[str, Any]:
        """What the driver's :class:`ActorEngine` mirrors: the protocol's attributes, the engine's record and
        where the actor runs."""
        return {
            "max_model_len": self.engine.max_model_len,
            "supports_regex": self.engine.supports_regex,
            "describe": self.engine.describe(),
            "placement": self.placement,
        }

    def generate(self, request: GenerationRequest) -> Generation:
        return self._thread.run(self.engine.generate(request))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.engine.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)

    def warmup(self, regexes: list[str]) -> dict[str, float]:
        return self._thread.run(self.engine.warmup(regexes))

    def reset_prefix_cache(self) -> bool:
        return self._thread.run(self.engine.reset_prefix_cache())

    def close(self) -> None:
        self._thread.run(self.engine.close())
        self._thread.stop()


class ActorEngine:
    """The driver's :class:`~raypipe.llm.base.Engine` over an :class:`EngineHost` actor (module docstring).
    An :class:`~raypipe.llm.base.EngineError` raised in the actor is raised here as one (Ray's task error
    derives from the cause's class)."""

    def __init__(self, handle: Any):
        import ray

        self.handle = handle
        info = ray.get(handle.info.remote())
        self.max_model_len: int = info["max_model_len"]
        self.supports_regex: bool = info["supports_regex"]
        self.placement: dict[str, Any] = info["placement"]
        self._describe: dict[str, Any] = info["describe"]

    async def generate(self, request: GenerationRequest) -> Generation:
        return await self.handle.generate.remote(request)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        import ray

        return ray.get(self.handle.apply_chat_template.remote(messages, add_generation_prompt))

    def count_tokens(self, text: str) -> int:
        import ray

        return ray.get(self.handle.count_tokens.remote(text))

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        return await self.handle.warmup.remote(list(regexes))

    async def reset_prefix_cache(self) -> bool:
        return await self.handle.reset_prefix_cache.remote()

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "node_id": self.placement["node_id"]}

    async def close(self) -> None:
        import ray

        try:
            await self.handle.close.remote()
        finally:
            ray.kill(self.handle)


def actor_engine_factory(
    generation: GenerationConfig, engine_factory: Callable[[EngineConfig], Engine] | None = None
) -> Callable[[EngineConfig], Engine]:
    """An engine factory for a driver (Ray initialised): each engine it makes is built by ``engine_factory``
    (default :func:`build_engine`; it must pickle) in a new :class:`EngineHost` actor placed by ``generation``'s
    actor resources; it returns once the engine is up."""
    import ray

    def start(config: EngineConfig) -> Engine:
        actor = ray.remote(EngineHost).options(
            num_cpus=generation.actor_num_cpus,
            num_gpus=generation.actor_num_gpus,
            resources=generation.resources or None,
            max_concurrency=generation.max_concurrent_trajectories,
        )
        return ActorEngine(actor.remote(config.model_dump(mode="json"), engine_factory))

    return start
