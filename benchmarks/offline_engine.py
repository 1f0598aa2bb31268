"""The peers' engine for benchmarks/probe.py's ``offline-turn-sync``: vLLM's offline ``LLM`` under a turn barrier.

pyterrier-rag's ``VLLMBackend`` and Search-R1's ``generation.py`` advance every live trajectory in lock-step and
serve each phase of a turn (the turns, then the probes) with ONE blocking ``LLM.generate(prompts, params)`` over
all of them. :class:`OfflineBatchEngine` gives raypipe's agent loop that engine: each ``generate`` queues its
request, and once no live trajectory can add one to the phase (each is waiting for the engine or at the turn
barrier, :class:`LockstepBarrier`), one ``LLM.generate`` in a worker thread serves them all and each caller gets
its own output. The engine is built with the async engine's settings, environment and compile cache
(raypipe.llm.vllm_engine), requests become the same ``SamplingParams`` (``sampling_params``; ``LLM`` sets
``output_kind`` FINAL_ONLY itself, as that function does) and outputs the same ``Generation`` (``to_generation``).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from raypipe.agents.barrier import TurnBarrier
from raypipe.core.config import EngineConfig
from raypipe.core.models import cache_dir, engine_model
from raypipe.llm.base import EngineError, Generation, GenerationRequest
from raypipe.llm.common import LocalTokenizer, engine_record, tokenized_request
from raypipe.llm.vllm_engine import VLLMEngine, engine_kwargs, sampling_params, to_generation, vllm_environment


class LockstepBarrier(TurnBarrier):
    """A turn barrier that tells its engine whenever a party arrives or leaves: either may leave every live party
    waiting (for the engine or here), and then the engine's pending requests are the whole phase."""

    def __init__(self, parties: int, on_change: Callable[[], None]):
        super().__init__(parties)
        self._on_change = on_change

    @property
    def waiting(self) -> int:
        """Parties waiting here for the others (none once released)."""
        return self._arrived

    async def wait(self) -> None:
        asyncio.get_running_loop().call_soon(self._on_change)  # runs once this party waits here (counted)
        await super().wait()

    def leave(self) -> None:
        super().leave()
        self._on_change()


@dataclass
class _Pending:
    prompt_ids: list[int]
    params: Any  # vLLM SamplingParams
    logprobs: bool
    future: asyncio.Future


class OfflineBatchEngine:
    """The :class:`~raypipe.llm.base.Engine` protocol over vLLM's offline ``LLM``, one ``generate`` call per phase.

    Without a barrier (the warm-up) every request is its own call. ``batch_sizes``: the requests of each call since
    the last :meth:`lockstep_barrier`.
    """

    supports_regex = True  # structured outputs, as the async engine
    warmup = VLLMEngine.warmup  # the same requests: one short one per regex (it only calls generate)

    def __init__(
        self,
        llm: Any,
        tokenizer: LocalTokenizer,
        config: EngineConfig,
        model_path: Path | None = None,
        dtype: str | None = None,
        start_seconds: float = 0.0,
    ):
        self.llm, self.tokenizer, self.config = llm, tokenizer, config
        self.max_model_len = config.max_model_len
        self.model_path, self.dtype, self.start_seconds = model_path, dtype, start_seconds
        self.batch_sizes: list[int] = []
        self._barrier: LockstepBarrier | None = None
        self._pending: list[_Pending] = []
        self._batches: set[asyncio.Task] = set()  # running calls (the loop keeps only weak references)
        self._llm_lock = threading.Lock()  # vLLM's LLM serves one call at a time

    def lockstep_barrier(self, parties: int) -> LockstepBarrier:
        """The turn barrier of ``parties`` trajectories started together; this engine batches their requests by it."""
        self._barrier = LockstepBarrier(parties, self._run_if_complete)
        self.batch_sizes = []
        return self._barrier

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count_tokens(text)

    async def generate(self, request: GenerationRequest) -> Generation:
        prompt_ids, max_tokens = tokenized_request(self.tokenizer, request, self.max_model_len)
        pending = _Pending(
            prompt_ids,
            sampling_params(request, max_tokens),
            request.logprobs,
            asyncio.get_running_loop().create_future(),
        )
        self._pending.append(pending)
        self._run_if_complete()
        return await pending.future

    def _run_if_complete(self) -> None:
        """Run the pending requests as one call once no live party can add one: each waits for the engine or at
        the barrier (a party elsewhere may still request, arrive or leave, and each of those checks again)."""
        barrier = self._barrier
        if not self._pending or (barrier is not None and len(self._pending) + barrier.waiting < barrier.parties):
            return
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._run(batch))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run(self, batch: list[_Pending]) -> None:
        self.batch_sizes.append(len(batch))
        try:
            outputs = await asyncio.to_thread(self._generate, [p.prompt_ids for p in batch], [p.params for p in batch])
            if len(outputs) != len(batch):
                raise RuntimeError(f"{len(outputs)} outputs for {len(batch)} prompts")
        except Exception as exc:  # noqa: BLE001 - the call failed: so did every request in it
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(EngineError(f"vLLM LLM.generate failed: {type(exc).__name__}: {exc}"))
            return
        for p, output in zip(batch, outputs):
            if p.future.done():  # its caller was cancelled
                continue
            try:
                p.future.set_result(to_generation(output, p.logprobs))
            except Exception as exc:  # noqa: BLE001 - its caller gets it, as from the async engine's generate
                p.future.set_exception(exc)

    def _generate(self, prompt_ids: list[list[int]], params: list[Any]) -> list[Any]:
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]  # vLLM's TokensPrompt
        with self._llm_lock:
            return self.llm.generate(prompts, params, use_tqdm=False)

    async def reset_prefix_cache(self) -> bool:
        with self._llm_lock:
            return self.llm.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        return {
            **engine_record(self, self.config, self.model_path, self.dtype, self.start_seconds),
            "api": "vllm.LLM (offline; one generate call per phase of a turn)",
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "structured_outputs_backend": self.config.structured_outputs_backend,
            "enforce_eager": self.config.enforce_eager,
        }

    async def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()  # ends the EngineCore process (LLM has no shutdown of its own)


def start_offline_engine(config: EngineConfig) -> OfflineBatchEngine:
    """vLLM's ``LLM`` with the async engine's arguments (``engine_kwargs``: dtype, block size, prefix caching,
    enforce_eager, KV cache, stats), environment (thread binding) and compile cache; blocks while it starts."""
    started = time.perf_counter()  # as VLLMEngine's: includes importing vLLM and loading the tokenizer
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
    from vllm import LLM
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.platforms import current_platform

    model_path = engine_model(config)  # the run's agent: the adapter merged, as the async engine loads it
    tokenizer = LocalTokenizer(model_path)
    on_cpu = current_platform.is_cpu()
    async_only = {f.name for f in fields(AsyncEngineArgs)} - {f.name for f in fields(EngineArgs)}
    kwargs = {k: v for k, v in engine_kwargs(config, str(model_path), on_cpu).items() if k not in async_only}
    os.environ.update(vllm_environment(config, on_cpu))
    llm = LLM(**kwargs)
    return OfflineBatchEngine(llm, tokenizer, config, model_path, kwargs["dtype"], time.perf_counter() - started)
