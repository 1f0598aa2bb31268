"""The retrieval service on Ray: replica actors that coalesce concurrent queries, and their client.

``start_retrieval_service(config)`` builds or reuses the index (:func:`ensure_index`), starts
``retrieval.replicas`` :class:`RetrievalActor` s with ``retrieval.num_cpus`` / ``num_gpus`` each, waits
until they have loaded, and returns a :class:`RetrievalClient`. The client is picklable (it holds actor
handles), so it can be passed into generation actors and Ray tasks; its ``await search(queries, k)``
goes to the replicas round robin. Each actor queues the requests it receives and runs them as one
batch every ``max_wait_ms`` or as soon as ``max_batch_size`` queries are waiting. A replica whose process
dies is restarted by Ray (``retrieval.max_restarts``) and the searches it was serving are sent again
(``retrieval.max_task_retries``; a search has no side effects), so callers only see the delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from raypipe.config import RunConfig
from raypipe.raycluster import current_node_id, init_ray
from raypipe.retrieval.build import encoder_spec, ensure_index, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.searcher import LocalRetriever
from raypipe.retrieval.types import SearchResult

log = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], list[SearchResult]]


@dataclass
class _Request:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class QueryBatcher:
    """Coalesces concurrent ``search`` calls into batched calls of a blocking ``search_fn``.

    A drain task waits up to ``max_wait_s`` for a batch to fill (or until ``max_batch_size`` queries
    are queued), then runs batches of at most ``max_batch_size`` queries (a bigger single request is
    not split) until the queue is empty; requests that arrive during a search form the next batch.
    Requests with different ``k`` are searched separately. ``search_fn`` runs on one worker thread,
    so the event loop keeps accepting requests meanwhile.
    """

    def __init__(self, search_fn: SearchFn, max_batch_size: int = 64, max_wait_s: float = 0.005):
        self.search_fn = search_fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._pending: list[_Request] = []
        self._queued = 0
        self._full: asyncio.Event | None = None
        self._drainer: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self.batches = 0  # search_fn calls made (for tests and stats)

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        loop = asyncio.get_running_loop()
        if self._full is None:
            self._full = asyncio.Event()
        request = _Request(list(queries), k, loop.create_future())
        self._pending.append(request)
        self._queued += len(request.queries)
        if self._queued >= self.max_batch_size:
            self._full.set()
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        try:
            if self._queued < self.max_batch_size and self.max_wait_s > 0:
                try:
                    await asyncio.wait_for(self._full.wait(), self.max_wait_s)
                except asyncio.TimeoutError:
                    pass
            while self._pending:
                await self._run(self._take())
        finally:
            self._drainer = None

    def _take(self) -> list[_Request]:
        """Requests from the head of the queue worth at most ``max_batch_size`` queries (at least one)."""
        count, taken = 0, 0
        for request in self._pending:
            if taken and count + len(request.queries) > self.max_batch_size:
                break
            count += len(request.queries)
            taken += 1
        batch, self._pending = self._pending[:taken], self._pending[taken:]
        self._queued -= count
        if self._queued < self.max_batch_size:
            self._full.clear()
        return batch

    async def _run(self, requests: list[_Request]) -> None:
        by_k: dict[int, list[_Request]] = {}
        for request in requests:
            by_k.setdefault(request.k, []).append(request)
        loop = asyncio.get_running_loop()
        for k, group in by_k.items():
            queries = [q for r in group for q in r.queries]
            try:
                results = await loop.run_in_executor(self._executor, self.search_fn, queries, k)
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for r in group:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            finally:
                self.batches += 1
            offset = 0
            for r in group:
                if not r.future.done():
                    r.future.set_result(results[offset : offset + len(r.queries)])
                offset += len(r.queries)


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


def start_retrieval_service(config: RunConfig, force_rebuild: bool = False) -> RetrievalClient:
    """Build or reuse the configured index, launch the replicas, and return their client."""
    init_ray(config)
    return launch_replicas(config, ensure_index(config, force=force_rebuild))
