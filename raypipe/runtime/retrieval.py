"""The retrieval service on Ray: replica actors that coalesce concurrent queries, and their client.

``start_retrieval_service(config, index_path)`` joins or starts Ray and, over an index directory that
exists (the probe job builds or reuses it with :func:`raypipe.stages.index.ensure_index`), starts
``retrieval.replicas`` :class:`RetrievalActor` s with ``retrieval.num_cpus`` / ``num_gpus`` each, waits
until they have loaded, and returns a :class:`RetrievalClient`. The client is picklable (it holds actor
handles), so it can be passed into generation actors and Ray tasks; its ``await search(queries, k)``
goes to the replicas round robin. Each actor queues the requests it receives and runs them as one
batch every ``max_wait_ms`` or as soon as ``max_batch_size`` queries are waiting. A replica whose process
dies is restarted by Ray (``retrieval.max_restarts``) and the searches it was serving are sent again
(``retrieval.max_task_retries``; a search has no side effects), so callers only see the delay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from raypipe.core.config import RunConfig
from raypipe.retrieval.batcher import QueryBatcher
from raypipe.retrieval.build import encoder_spec, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.http_client import HttpRetriever
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.searcher import LocalRetriever, StoredVectors
from raypipe.retrieval.store import tokenize
from raypipe.retrieval.types import Retriever, SearchResult
from raypipe.runtime.cluster import current_node_id, init_ray

log = logging.getLogger(__name__)


def open_replica(index_path: str, spec: EncoderSpec, params: SearchParams, threads: int | None = None) -> LocalRetriever:
    """A replica's searcher: the index, with ``threads`` (``retrieval.search_threads``) for FAISS and the encoder."""
    if threads:
        import faiss

        faiss.omp_set_num_threads(threads)
        spec = EncoderSpec(**{**spec.__dict__, "threads": threads})
    return LocalRetriever.open(index_path, spec, params)


class RetrievalActor:
    """One replica: index + query encoder + doc store behind a :class:`QueryBatcher` (async actor)."""

    def __init__(self, index_path: str, spec: EncoderSpec, params: SearchParams, max_batch_size: int,
                 max_wait_ms: float, threads: int | None = None):
        self.retriever = open_replica(index_path, spec, params, threads)
        self.batcher = QueryBatcher(self.retriever.search_batch, max_batch_size, max_wait_ms / 1000)

    async def ready(self) -> dict:
        return {"count": self.retriever.index.ntotal, "encoder": self.retriever.encoder.name, "node_id": current_node_id()}

    async def search(self, queries: list[str], k: int) -> list[SearchResult]:
        return await self.batcher.search(queries, k)

    async def stats(self) -> dict:
        return {"batches": self.batcher.batches}

    # What the features stage needs from the index, so that it loads no index of its own.

    async def corpus_info(self) -> dict:
        """``n_docs`` (the statistics' passage count) and the vector dimension."""
        return {"n_docs": int(self.corpus_stats.n_docs), "dimension": int(self.retriever.index.d)}

    async def doc_vectors(self, doc_ids: list[str]):
        """The stored vectors of passage ids, one float32 row per id, in order (KeyError if one is unknown)."""
        return self.vector_reader.doc_vectors(doc_ids)

    async def document_frequencies(self, terms: list[str]) -> list[int]:
        """Passages containing each (already tokenised) term; 0 for an unknown term."""
        return [self.corpus_stats.df(t) for t in terms]

    async def encode_queries(self, texts: list[str]):
        return self.retriever.encoder.encode_queries(list(texts))

    @cached_property
    def corpus_stats(self):
        return self.retriever.index_dir.stats

    @cached_property
    def vector_reader(self):
        return StoredVectors(self.retriever)


class RetrievalClient:
    """Implements the ``Retriever`` protocol over replica actors (round robin). Picklable."""

    def __init__(self, actors: Sequence, index_path: str | Path, node_ids: Sequence[str | None] = ()):
        if not actors:
            raise ValueError("a retrieval client needs at least one actor")
        self.actors = list(actors)
        self.index_path = str(index_path)
        self.node_ids = list(node_ids)  # where each replica was placed
        self._next = 0

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        actor = self.actors[self._next % len(self.actors)]
        self._next += 1
        return await actor.search.remote(list(queries), k)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


class ServiceCorpus:
    """The features' ``CorpusResources`` answered by the retrieval service's replicas (batched calls, round
    robin), so a features actor holds no index: document vectors, document frequencies (fetched for a
    whole batch's terms with :meth:`prefetch_terms`), the query encoder and the question's own list."""

    def __init__(self, client: RetrievalClient):
        import ray

        self._ray = ray
        self.client = client
        self._next = 0
        self.num_docs = int(self._call("corpus_info")["n_docs"])
        self._df: dict[str, int] = {}

    def _call(self, method: str, *args):
        actor = self.client.actors[self._next % len(self.client.actors)]
        self._next += 1
        return self._ray.get(getattr(actor, method).remote(*args))

    def terms(self, text: str) -> list[str]:
        return tokenize(text)

    def prefetch_terms(self, terms: Sequence[str]) -> None:
        """Fetch the document frequencies of ``terms`` (those not fetched before) in one call."""
        wanted = list(dict.fromkeys(t for t in terms if t not in self._df))
        if wanted:
            self._df.update(zip(wanted, self._call("document_frequencies", wanted)))

    def document_frequency(self, term: str) -> int:
        if term not in self._df:
            self._df[term] = self._call("document_frequencies", [term])[0]
        return self._df[term]

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.asarray(self._call("doc_vectors", list(doc_ids)), dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._call("encode_queries", list(texts)), dtype=np.float32)

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        results = self._call("search", list(texts), k)
        return [[hit.doc_id for hit in result.hits] for result in results]


def launch_replicas(config: RunConfig, index_path: str | Path) -> RetrievalClient:
    """Start the replica actors for an existing index and wait until each has loaded it."""
    import ray

    cfg = config.retrieval
    spec = encoder_spec(cfg)
    IndexDir(index_path, spec)  # manifest/encoder check in the driver, before any actor starts
    actor_cls = ray.remote(RetrievalActor).options(
        num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, resources=cfg.resources or None, max_concurrency=1000,
        max_restarts=cfg.max_restarts, max_task_retries=cfg.max_task_retries,
    )
    actors = [
        actor_cls.remote(str(index_path), spec, search_params(cfg), cfg.max_batch_size, cfg.max_wait_ms,
                         cfg.search_threads)
        for _ in range(cfg.replicas)
    ]
    info = ray.get([a.ready.remote() for a in actors])
    log.info("retrieval service: %d replica(s) over %d passages (%s)", len(actors), info[0]["count"],
             info[0]["encoder"])
    return RetrievalClient(actors, index_path, [i["node_id"] for i in info])


def start_retrieval_service(config: RunConfig, index_path: str | Path) -> RetrievalClient:
    """Join or start Ray, launch the replicas over the index at ``index_path``, and return their client."""
    init_ray(config)
    return launch_replicas(config, index_path)


def open_retrieval(config: RunConfig, ensure_index: Callable[[RunConfig], Path]) -> Retriever:
    """The job's retriever for ``retrieval.backend``: replicas started here over ``ensure_index(config)``
    (``actors``), a Search-R1-style server at ``retrieval.url`` (``http``), or the ``raypipe serve-retrieval``
    deployment ``retrieval.deployment`` on the job's Ray cluster (``serve``). Each has ``shutdown()``, which
    stops only what the job started; the shared ones also have ``describe()`` (where, and what the server
    reports) for the run's info."""
    backend = config.retrieval.backend
    if backend == "http":
        return HttpRetriever.from_config(config.retrieval)
    if backend == "serve":
        from raypipe.runtime.serve import ServeRetriever

        init_ray(config)
        return ServeRetriever(config.retrieval.deployment)
    return start_retrieval_service(config, ensure_index(config))
