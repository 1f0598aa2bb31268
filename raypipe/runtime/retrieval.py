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
from collections.abc import Sequence
from pathlib import Path

from raypipe.core.config import RunConfig
from raypipe.retrieval.batcher import QueryBatcher
from raypipe.retrieval.build import encoder_spec, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.searcher import LocalRetriever
from raypipe.retrieval.types import SearchResult
from raypipe.runtime.cluster import current_node_id, init_ray

log = logging.getLogger(__name__)


class RetrievalActor:
    """One replica: index + query encoder + doc store behind a :class:`QueryBatcher` (async actor)."""

    def __init__(self, index_path: str, spec: EncoderSpec, params: SearchParams, max_batch_size: int,
                 max_wait_ms: float, threads: int | None = None):
        if threads:
            import faiss

            faiss.omp_set_num_threads(threads)
            spec = EncoderSpec(**{**spec.__dict__, "threads": threads})
        self.retriever = LocalRetriever.open(index_path, spec, params)
        self.batcher = QueryBatcher(self.retriever.search_batch, max_batch_size, max_wait_ms / 1000)

    async def ready(self) -> dict:
        return {"count": self.retriever.index.ntotal, "encoder": self.retriever.encoder.name, "node_id": current_node_id()}

    async def search(self, queries: list[str], k: int) -> list[SearchResult]:
        return await self.batcher.search(queries, k)

    async def stats(self) -> dict:
        return {"batches": self.batcher.batches}


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
