"""The ``engine`` section: the LLM backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypipe.core.config.base import StrictModel


class EngineConfig(StrictModel):
    backend: Literal["vllm", "transformers", "openai"] = "vllm"
    model: str = Field(default="smollm2", description="Embedded model name, local HF folder or GGUF file.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="auto: the model's own dtype on a GPU; on a CPU bfloat16 where it computes bfloat16 natively "
        "(AVX512-BF16, AMX), else float32 (emulated bfloat16 is about 40x slower).",
    )
    max_model_len: int = Field(default=4096, ge=256)
    kv_cache_gib: float = Field(default=2.0, gt=0, description="KV cache size on CPU (vLLM needs one).")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="vLLM tensor parallelism: GPUs per engine; a GPU actor holding an engine "
        "(generation.actor_num_gpus, serve_agent.num_gpus) must have as many.",
    )
    block_size: int | None = Field(default=32, ge=1, description="KV block; small so probes hit the prefix cache.")
    enable_prefix_caching: bool = True
    cpu_threads: str | None = Field(
        default="all",
        description="vLLM on CPU: 'all' binds its threads to every physical core and keeps none for its frontend "
        "(+17-40% tokens/s on 2 cores); null: vLLM's own binding, which keeps one core for its frontend (what "
        "runs before this default used); or a VLLM_CPU_OMP_THREADS_BIND core list such as '0-1'.",
    )
    enforce_eager: bool = Field(
        default=False, description="vLLM without torch.compile: no compile at first start, slower steps."
    )
    request_timings: bool = Field(
        default=True,
        description="vLLM: record each request's queue and engine seconds (iterations.queue_s/engine_s); "
        "turns on vLLM's stats collection (no periodic log lines without a server).",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="vLLM's cap on sequences per step; None = its default."
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        description="vLLM's token budget per scheduler step (prompt chunks plus one token per decoding sequence); "
        "None = its default (2048 on CPU with chunked prefill).",
    )
    enable_chunked_prefill: bool | None = Field(
        default=None,
        description="vLLM: split long prompts into chunks that share steps with decoding sequences; None = its "
        "default.",
    )
    speculative_ngram_tokens: int | None = Field(
        default=None,
        ge=1,
        description="vLLM n-gram speculative decoding (prompt lookup, no draft model): tokens proposed per step by "
        "matching the context's last n-gram earlier in it; None = off. vLLM then disables async scheduling.",
    )
    speculative_ngram_max: int = Field(
        default=4, ge=1, description="Longest n-gram looked up (speculative_ngram_tokens)."
    )
    speculative_ngram_min: int = Field(
        default=2, ge=1, description="Shortest n-gram looked up (speculative_ngram_tokens)."
    )
    structured_outputs_backend: Literal["xgrammar", "guidance", "outlines", "auto"] = Field(
        default="xgrammar", description="vLLM structured-output backend for regex enforcement (changes model choices)."
    )
    regex_compile_timeout_s: int = Field(
        default=60,
        ge=1,
        description="vLLM gives up compiling a regex after this (its own default, 5 s, is too short on CPU).",
    )
    base_url: str | None = Field(
        default=None, description="OpenAI-compatible server (backend=openai), e.g. http://host:8000/v1."
    )
    api_key_env: str = "OPENAI_API_KEY"
    served_model: str | None = Field(
        default=None, description="Model name sent to the server (backend=openai); default: model."
    )
    tokenizer: str | None = Field(
        default=None,
        description="Local tokenizer (embedded name or folder) for chat template and token counts; default: model.",
    )
    request_timeout_s: float = Field(default=300.0, gt=0, description="Per HTTP request (backend=openai).")
    max_retries: int = Field(default=3, ge=0, description="Retries with exponential backoff (backend=openai).")
    seed: int = 0
    adapter: str | None = Field(
        default=None,
        description="A tuned-agent artifact: a bundled one's name (smollm2-searchr1) or a folder "
        "(`raypipe tune-agent`): its weight delta is applied to the model when it is converted, its checksums "
        "checked; None: the model as it is.",
    )

    @model_validator(mode="after")
    def _check_engine_levers(self) -> EngineConfig:
        """Lever combinations vLLM would refuse only after loading the model."""
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(
                f"speculative_ngram_min={self.speculative_ngram_min} must be <= "
                f"speculative_ngram_max={self.speculative_ngram_max}"
            )
        budget = self.max_num_batched_tokens
        if self.enable_chunked_prefill is False and budget is not None and budget < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} < max_model_len={self.max_model_len} without chunked prefill: "
                "a longer prompt could never be scheduled; raise max_num_batched_tokens or enable chunked prefill"
            )
        return self
