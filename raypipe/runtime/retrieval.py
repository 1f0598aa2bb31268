"""The retrieval service on Ray: replica actors that coalesce concurrent queries, and their client.

``start_retrieval_service(config, index_path)``, on the connected Ray and over an index directory that
exists (the probe job builds or reuses it with :func:`raypipe.runtime.index_build.ensure_index`), starts
``retrieval.actors.replicas`` :class:`RetrievalActor` s with ``retrieval.actors.num_cpus`` / ``num_gpus`` each, waits
until they have loaded (at most ``retrieval.start_timeout_s``: then :class:`RetrievalStartError`, which names
what each replica asks), and returns a :class:`RetrievalClient`. The client is picklable (it holds actor
handles), so it can be passed into generation actors and Ray tasks; its ``await search(queries, k)``
goes to the replicas round robin. Each actor queues the requests it receives and runs them as one
batch every ``max_wait_ms`` or as soon as ``max_batch_size`` queries are waiting.

Replica deaths. A replica whose process dies is restarted by Ray (``retrieval.actors.max_restarts``), and the
client sends the searches it was serving again, up to ``retrieval.actors.max_task_retries`` times each (a search
has no side effects), so callers only see the delay. The client makes those retries itself, not Ray: it
sends each search once (``try_search``, with Ray's retries off: one call when nothing dies), so that
it sees every death. A query that kills the replica process (a crash in the encoder or
FAISS on that input) would otherwise take down, retry after retry, every query coalesced with it, so:

- Each :class:`RetrievalClient` counts, per query text, the replica deaths the query was in flight for
  (every query of a send that failed with a Ray actor error), since it last succeeded. The count lives in
  the client, and so in the process that sends the query (the generation actor whose trajectory asked
  for it): it sees every death of its own sends, and nothing else needs one. A generation actor that
  restarts starts with a new client and new counts; each query is still bounded, as below.
- A query whose count reaches ``retrieval.actors.max_query_crashes`` (default 2) is searched *alone*: the client
  claims a replica (``claim``: the replica waits until its queued and running batches are done, and from
  then on refuses every other request with ``ReplicaBusy``, which the client sends to the next replica or
  again a moment later, uncharged), then sends that one query under the claim (``search_alone``), which
  releases it. A death during ``search_alone`` is that query's alone; a death during ``claim`` is
  nobody's (the claim is asked again). A claim whose search does not come within ``claim_hold_s`` lapses.
- A query that kills its replica while alone fails that search with
  :class:`~raypipe.retrieval.types.QueryCrashError` ("in flight at 3 retrieval replica deaths, the last one
  alone ..."), which the agent loop writes as ``query_crash`` (kept by a rerun); the client never sends it again. The
  other queries of its batches were charged the same deaths, so some run alone once and succeed: their results are the
  same as without it.
- So a query that kills every replica it reaches costs ``max_query_crashes`` + 1 replica restarts, and an
  innocent one coalesced with it ``max_query_crashes`` failed sends at most (then it runs alone).
  ``retrieval.actors.max_task_retries`` still caps the failed sends of one search (deaths, claims lost); with
  ``max_task_retries=0`` (retries off) a search is sent once and fails with Ray's error at the first death, and so does
  every query coalesced with it (no isolation). ``-1``: no cap but isolation and ``UNLIMITED_RETRIES``.

The corpus-side methods (:class:`~raypipe.runtime.corpus_service.CorpusMethods`, the features stage's) and
the plain ``search`` (``ReplicaTransport``) keep Ray's retries (``retrieval.actors.max_task_retries``) and are not
counted; a plain ``search`` waits while the replica is claimed, and corpus calls are not held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from raypipe.core.config import RunConfig
from raypipe.retrieval.batcher import ClaimLost, QueryBatcher, ReplicaBusy
from raypipe.retrieval.build import encoder_spec, index_dir_for, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.http_client import HttpRetriever
from raypipe.retrieval.index import MANIFEST, IndexDir, SearchParams
from raypipe.retrieval.searcher import LocalRetriever
from raypipe.retrieval.types import QueryCrashError, ReplicaService, SearchResult, SharedRetrievalService
from raypipe.runtime.cluster import current_node_id
from raypipe.runtime.corpus_service import (
    CorpusMethods,
    CorpusTransport,
    HttpTransport,
    ReplicaTransport,
    ServeTransport,
)
from raypipe.runtime.index_build import ensure_index
from raypipe.runtime.shared_storage import SharedPath, alive_nodes, check_shared_storage

log = logging.getLogger(__name__)

UNLIMITED_RETRIES = 100  # retrieval.actors.max_task_retries=-1: failed sends of one search before it fails (a backstop)
BUSY_TIMEOUT_S = 300.0  # a search refused by every replica (held for searches alone) this long fails


def open_replica(
    index_path: str, spec: EncoderSpec, params: SearchParams, threads: int | None = None
) -> LocalRetriever:
    """A replica's searcher: the index, with ``threads`` (``retrieval.actors.search_threads``) for FAISS and the
    encoder."""
    if threads:
        import faiss

        faiss.omp_set_num_threads(threads)
        spec = EncoderSpec(**{**spec.__dict__, "threads": threads})
    return LocalRetriever.open(index_path, spec, params)


class RetrievalActor(CorpusMethods):
    """One replica: index + query encoder + doc store behind a :class:`QueryBatcher` (async actor); its
    corpus methods (:class:`~raypipe.runtime.corpus_service.CorpusMethods`) serve the features stage."""

    def __init__(
        self,
        index_path: str,
        spec: EncoderSpec,
        params: SearchParams,
        max_batch_size: int,
        max_wait_ms: float,
        threads: int | None = None,
        search_fault: Callable[[list[str]], None] | None = None,
    ):
        self.retriever = open_replica(index_path, spec, params, threads)
        search_fn = self.retriever.search_batch
        if search_fault is not None:  # a test's fault hook (tests/helpers/faults.py), in the replica's process

            def search_fn(queries: list[str], k: int, search=self.retriever.search_batch) -> list[SearchResult]:
                search_fault(queries)
                return search(queries, k)

        self.batcher = QueryBatcher(search_fn, max_batch_size, max_wait_ms / 1000)

    async def ready(self) -> dict:
        return {
            "count": self.retriever.index.ntotal,
            "encoder": self.retriever.encoder.name,
            "node_id": current_node_id(),
        }

    async def search(self, queries: list[str], k: int) -> list[SearchResult]:
        """Coalesced with the other waiting requests; waits while the replica is claimed (Ray retries it)."""
        return await self.batcher.search(queries, k)

    async def try_search(self, queries: list[str], k: int) -> list[SearchResult]:
        """:class:`RetrievalClient`'s search (sent once): coalesced, or ``ReplicaBusy`` while claimed."""
        return await self.batcher.search(queries, k, refuse_when_claimed=True)

    async def claim(self) -> str:
        """Hold the replica for one :meth:`search_alone`, once nothing else runs on it."""
        return await self.batcher.claim()

    async def search_alone(self, claim: str, queries: list[str], k: int) -> list[SearchResult]:
        return await self.batcher.search_alone(claim, queries, k)

    async def stats(self) -> dict:
        """Search calls made for coalesced requests, searches run alone, requests refused while claimed."""
        return {"batches": self.batcher.batches, "alone": self.batcher.alone, "refused": self.batcher.refused}


class _Attempts:
    """What one search may still spend: failed sends (``retrieval.actors.max_task_retries``) and refusals."""

    def __init__(self, retries: int, replicas: int):
        self.left = retries if retries >= 0 else UNLIMITED_RETRIES
        self.replicas, self.refusals, self.busy_since = replicas, 0, 0.0

    def failed(self, error: BaseException) -> None:
        """A send failed (a replica death, a lost claim): raise ``error`` when no resend is left."""
        self.left -= 1
        if self.left < 0:
            raise error

    async def refused(self) -> None:
        """A replica refused (held for a search alone): after each round of the replicas, wait a little."""
        self.refusals += 1
        if self.refusals == 1:
            self.busy_since = time.monotonic()
        if self.refusals % self.replicas == 0:
            if time.monotonic() - self.busy_since > BUSY_TIMEOUT_S:
                raise ReplicaBusy(f"every retrieval replica refused this search for {BUSY_TIMEOUT_S:.0f} s")
            await asyncio.sleep(min(0.2, 0.005 * 2 ** min(self.refusals // self.replicas, 6)))


class RetrievalClient:
    """A :class:`~raypipe.retrieval.types.ReplicaService` over replica actors (round robin), resending a search whose
    replica died and searching alone a query in flight at ``max_query_crashes`` deaths (module docstring).
    Picklable; each copy keeps its own counts."""

    def __init__(
        self,
        actors: Sequence,
        index_path: str | Path,
        node_ids: Sequence[str | None] = (),
        max_task_retries: int = 3,
        max_query_crashes: int = 2,
    ):
        if not actors:
            raise ValueError("a retrieval client needs at least one actor")
        self.actors = list(actors)
        self.index_path = str(index_path)
        self.node_ids = list(node_ids)  # where each replica was placed
        self.max_task_retries, self.max_query_crashes = max_task_retries, max_query_crashes
        self._next = 0
        self._deaths: dict[str, int] = {}  # query -> replica deaths it was in flight for since it last succeeded
        self._killers: dict[str, str] = {}  # query -> why it is not sent again (it killed a replica alone)

    def _actor(self):
        actor = self.actors[self._next % len(self.actors)]
        self._next += 1
        return actor

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        from ray.exceptions import RayActorError

        queries = list(queries)
        if self.max_task_retries == 0:  # retries off: one send, its failure is the search's
            return await self._actor().try_search.options(max_task_retries=0).remote(queries, k)
        failure = None
        if not (self._deaths and any(q in self._deaths for q in queries)):
            try:  # the normal path: one call, as many round trips as without any of this
                return await self._actor().try_search.options(max_task_retries=0).remote(queries, k)
            except (RayActorError, ReplicaBusy) as exc:
                failure = exc
        return await self._recover(queries, k, failure)

    async def _recover(self, queries: list[str], k: int, failure: BaseException | None) -> list[SearchResult]:
        """After a failed send (``failure``), or for queries charged with deaths before: send again, charging
        each query of a failed send with a death; a query at ``max_query_crashes`` goes alone."""
        from ray.exceptions import RayActorError

        attempts = _Attempts(self.max_task_retries, len(self.actors))
        results: dict[int, SearchResult] = {}
        together = list(range(len(queries)))  # the queries still sent as one call
        while True:
            if isinstance(failure, ReplicaBusy):
                await attempts.refused()
            elif failure is not None:
                for query in dict.fromkeys(queries[i] for i in together):
                    self._deaths[query] = self._deaths.get(query, 0) + 1
                attempts.failed(failure)
            failure = None
            alone = {i for i in together if self._deaths.get(queries[i], 0) >= self.max_query_crashes}
            for i in sorted(alone):
                results[i] = await self._search_alone(queries[i], k, attempts)
            together = [i for i in together if i not in alone]
            if not together:
                break
            try:
                found = (
                    await self._actor().try_search.options(max_task_retries=0).remote([queries[i] for i in together], k)
                )
            except (RayActorError, ReplicaBusy) as exc:
                failure = exc
                continue
            results.update(zip(together, found))
            break
        for query in queries:
            self._deaths.pop(query, None)
        return [results[i] for i in range(len(queries))]

    async def _search_alone(self, query: str, k: int, attempts: _Attempts) -> SearchResult:
        """``query`` by itself on a claimed replica; :class:`QueryCrashError` if the replica dies under it."""
        from ray.exceptions import RayActorError

        if query in self._killers:
            raise QueryCrashError(self._killers[query])
        while True:
            actor = self._actor()
            try:
                claim = await actor.claim.options(max_task_retries=0).remote()
            except RayActorError as exc:  # it died clearing the way: nothing of this query ran there
                attempts.failed(exc)
                continue
            try:
                return (await actor.search_alone.options(max_task_retries=0).remote(claim, [query], k))[0]
            except ClaimLost as exc:
                attempts.failed(exc)
            except RayActorError as exc:
                deaths = self._deaths[query] = self._deaths.get(query, 0) + 1
                self._killers[query] = (
                    f"in flight at {deaths} retrieval replica deaths, the last one alone "
                    f"(retrieval.actors.max_query_crashes={self.max_query_crashes}); "
                    f"last error: {type(exc).__name__}: {exc}"
                )
                log.warning("query %r killed its retrieval replica while searched alone: not sent again", query)
                raise QueryCrashError(self._killers[query]) from exc

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


class RetrievalStartError(RuntimeError):
    """Retrieval replicas were not ready within ``retrieval.start_timeout_s`` (one line: what they ask for)."""


def placement(num_cpus: float, num_gpus: float, resources: dict[str, float]) -> str:
    """What one replica asks of the cluster, as an error names it."""
    return f"num_cpus={num_cpus:g}, num_gpus={num_gpus:g}, resources={dict(resources or {})}"


def wait_ready(actors: list, timeout_s: float, asks: str) -> list[dict]:
    """Each replica's ``ready()`` answer, waited for at most ``timeout_s``; past it the replicas are killed and a
    :class:`RetrievalStartError` says how many were ready and what each asks (a replica that cannot be placed
    would otherwise be waited for forever)."""
    import ray

    calls = [a.ready.remote() for a in actors]
    done, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
    if len(done) < len(calls):
        for actor in actors:
            ray.kill(actor)
        raise RetrievalStartError(
            f"{len(calls) - len(done)} of {len(calls)} retrieval replica(s) not ready within {timeout_s:g} s "
            f"(retrieval.start_timeout_s); each asks {asks}: check the cluster has them (`ray status`) and the "
            "index loads on the nodes that do"
        )
    return ray.get(calls)


def start_retrieval_service(
    config: RunConfig, index_path: str | Path, search_fault: Callable[[list[str]], None] | None = None
) -> RetrievalClient:
    """Start the replica actors for an existing index on the connected Ray, wait until each has loaded it,
    and return their client.

    ``search_fault`` (tests only): a picklable callable each replica calls, in its own process, with the
    queries of every search it runs (``tests/helpers/faults.py``'s ``PoisonQuery``)."""
    import ray

    cfg = config.retrieval
    spec = encoder_spec(cfg)
    IndexDir(index_path, spec)  # manifest/encoder check in the driver, before any actor starts
    actor_cls = ray.remote(RetrievalActor).options(
        num_cpus=cfg.actors.num_cpus,
        num_gpus=cfg.actors.num_gpus,
        resources=cfg.actors.resources or None,
        max_concurrency=1000,
        max_restarts=cfg.actors.max_restarts,
        max_task_retries=cfg.actors.max_task_retries,
    )
    actors = [
        actor_cls.remote(
            str(index_path),
            spec,
            search_params(cfg),
            cfg.actors.max_batch_size,
            cfg.actors.max_wait_ms,
            cfg.actors.search_threads,
            search_fault,
        )
        for _ in range(cfg.actors.replicas)
    ]
    info = wait_ready(
        actors, cfg.start_timeout_s, placement(cfg.actors.num_cpus, cfg.actors.num_gpus, cfg.actors.resources)
    )
    log.info(
        "retrieval service: %d replica(s) over %d passages (%s)", len(actors), info[0]["count"], info[0]["encoder"]
    )
    return RetrievalClient(
        actors, index_path, [i["node_id"] for i in info], cfg.actors.max_task_retries, cfg.actors.max_query_crashes
    )


def open_retrieval(config: RunConfig, build: bool = True) -> ReplicaService | SharedRetrievalService:
    """The job's retrieval service for ``retrieval.backend``, on the connected Ray: replicas started here over
    the configured index (``actors``: built or reused by :func:`ensure_index` when ``build``, else the existing
    directory :func:`index_dir_for` names), a Search-R1-style server at ``retrieval.http.url`` (``http``), or the
    ``raypipe serve-retrieval`` deployment ``retrieval.serve.deployment`` on the job's Ray cluster (``serve``). Its
    ``shutdown()`` stops only what the job started."""
    backend = config.retrieval.backend
    if backend == "http":
        return HttpRetriever.from_config(config.retrieval)
    if backend == "serve":
        from raypipe.runtime.serve_client import ServeRetriever

        return ServeRetriever(config.retrieval.serve.deployment, config.retrieval.serve.timeout_s)
    path = ensure_index(config) if build else index_dir_for(config)
    check_index_visible(config, path)
    return start_retrieval_service(config, path)


def check_index_visible(config: RunConfig, path: Path) -> None:
    """On a multi-node Ray, every node that can hold a retrieval actor (the resources it asks for) sees the
    index at ``path``, or :class:`~raypipe.runtime.shared_storage.SharedStorageError` names the node."""
    index = SharedPath("retrieval index", path, "retrieval.index.dir", expect=MANIFEST, demand=retrieval_demand(config))
    check_shared_storage([index])


def check_index_folder(config: RunConfig) -> None:
    """On a multi-node Ray, before an index build: the folder the index goes into is visible on every node that
    can hold a retrieval actor, or :class:`~raypipe.runtime.shared_storage.SharedStorageError`."""
    nodes = alive_nodes()
    if len(nodes) > 1:  # the default index folder's name hashes the corpus: only worth it on a cluster
        folder = SharedPath(
            "index folder", index_dir_for(config).parent, "retrieval.index.dir", demand=retrieval_demand(config)
        )
        check_shared_storage([folder], nodes)


def retrieval_demand(config: RunConfig) -> dict[str, float]:
    """The resources one retrieval actor asks for: the nodes that have them are the ones that need the index."""
    r = config.retrieval
    return {**r.actors.resources, "CPU": r.actors.num_cpus, "GPU": r.actors.num_gpus}


def corpus_transport(service: ReplicaService | SharedRetrievalService) -> CorpusTransport:
    """How the features' :class:`ServiceCorpus` reaches the service :func:`open_retrieval` gave."""
    from raypipe.runtime.serve_client import ServeRetriever

    if isinstance(service, HttpRetriever):
        return HttpTransport(service)
    if isinstance(service, RetrievalClient):
        return ReplicaTransport(service)
    if isinstance(service, ServeRetriever):
        return ServeTransport(service)
    raise TypeError(f"no corpus transport for a {type(service).__name__}")
