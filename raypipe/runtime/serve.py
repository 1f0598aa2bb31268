"""The retrieval service as a Ray Serve deployment speaking Search-R1's HTTP API, and a job's client of it.

``deploy_retrieval(config, index_path, host, port)`` runs the application ``retrieval.deployment``:
``retrieval.replicas`` replicas (``retrieval.num_cpus`` / ``num_gpus`` / ``resources`` each), each holding
the index and query encoder exactly as an in-job :class:`~raypipe.runtime.retrieval.RetrievalActor`
does (same :func:`~raypipe.runtime.retrieval.open_replica`, so the same ids and scores), behind Serve's
HTTP proxy at ``http://HOST:PORT``:

- ``POST /retrieve``: Search-R1's request and response (``raypipe.retrieval.http_client``); a missing or
  zero ``topk`` falls back to ``retrieval.top_k`` or 3, as Search-R1's server falls back to its ``--topk``.
- ``GET /health``: status, passages, encoder, index path, and the replica's batch count.
- raypipe's own corpus endpoints under ``/raypipe`` (:mod:`raypipe.runtime.corpus_service`: passage
  vectors, document frequencies per lexicon, query vectors, the corpus size), which the features stage
  needs besides searches; the same calls as handle methods. Search-R1's API has no such calls.

Concurrent requests (HTTP or handle) are coalesced by Serve's request batching (``@serve.batch``): up to
``retrieval.max_batch_size`` requests, waiting at most ``retrieval.max_wait_ms``, become one search call
per distinct ``topk``. Jobs on the same Ray cluster can skip HTTP: :class:`ServeRetriever` calls the
deployment's ``search`` through a Serve handle (``retrieval.backend: serve``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.exceptions import RayServeException

from raypipe.core.config import RunConfig
from raypipe.retrieval.build import encoder_spec, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.http_client import RetrievalServerError, retrieve_response
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.types import SearchResult
from raypipe.runtime.corpus_service import PREFIX, CorpusMethods
from raypipe.runtime.retrieval import open_replica

DEFAULT_TOPK = 3  # Search-R1's retrieval_server.py --topk default, used when neither the request nor retrieval.top_k sets it

api = FastAPI(title="raypipe retrieval", description="Search-R1's POST /retrieve over a raypipe index")


class QueryRequest(BaseModel):
    """Search-R1's ``QueryRequest``."""

    queries: list[str]
    topk: int | None = Field(default=None, ge=0)
    return_scores: bool = False


class DocVectorsRequest(BaseModel):
    doc_ids: list[str]


class FrequenciesRequest(BaseModel):
    terms: list[str]
    lexicon: str = "plain"


class EncodeRequest(BaseModel):
    texts: list[str]


def vectors_response(vectors) -> JSONResponse:
    """Float32 rows as JSON lists of floats (exact: a float32 is a double, and JSON keeps doubles), built
    directly rather than through FastAPI's per-element encoder."""
    return JSONResponse({"vectors": vectors.tolist(), "dimension": int(vectors.shape[1])})


@serve.deployment
@serve.ingress(api)
class RetrievalDeployment(CorpusMethods):
    """One replica: the searcher of an in-job retrieval actor, fed by Serve's request batching, and its
    corpus methods (handle calls ``corpus_info``, ``doc_vectors``, ``document_frequencies``,
    ``encode_queries``; HTTP under ``/raypipe``)."""

    def __init__(self, index_path: str, spec: EncoderSpec, params: SearchParams, threads: int | None,
                 max_batch_size: int, max_wait_ms: float, default_topk: int):
        self.retriever = open_replica(index_path, spec, params, threads)
        self.index_path = index_path
        self.default_topk = default_topk
        self.batches = 0
        self._search_calls.set_max_batch_size(max_batch_size)
        self._search_calls.set_batch_wait_timeout_s(max_wait_ms / 1000)

    @api.post("/retrieve")
    async def retrieve(self, request: QueryRequest) -> dict[str, Any]:
        results = await self._search_calls((request.queries, request.topk or self.default_topk))
        return retrieve_response(results, request.return_scores)

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "passages": self.retriever.index.ntotal,
            "encoder": self.retriever.encoder.name,
            "index": self.index_path,
            "replica": serve.get_replica_context().replica_id.unique_id,
            "batches": self.batches,
            "corpus_endpoints": PREFIX,
        }

    @api.get(f"{PREFIX}/corpus_info")
    async def corpus_info_endpoint(self) -> dict[str, Any]:
        return await self.corpus_info()

    @api.post(f"{PREFIX}/doc_vectors")
    async def doc_vectors_endpoint(self, request: DocVectorsRequest) -> JSONResponse:
        try:
            return vectors_response(await self.doc_vectors(request.doc_ids))
        except KeyError as exc:
            raise HTTPException(status_code=400, detail=f"unknown passage id: {exc}") from None

    @api.post(f"{PREFIX}/document_frequencies")
    async def document_frequencies_endpoint(self, request: FrequenciesRequest) -> dict[str, Any]:
        try:
            return {"df": await self.document_frequencies(request.terms, request.lexicon)}
        except (LookupError, ValueError, NotImplementedError) as exc:  # an unknown lexicon, or one this index lacks
            raise HTTPException(status_code=400, detail=f"{type(exc).__name__}: {exc}") from None

    @api.post(f"{PREFIX}/encode_queries")
    async def encode_queries_endpoint(self, request: EncodeRequest) -> JSONResponse:
        return vectors_response(await self.encode_queries(request.texts))

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """The ``Retriever`` call for Serve handles (:class:`ServeRetriever`)."""
        return await self._search_calls((list(queries), k))

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)  # set from the config in __init__
    async def _search_calls(self, calls: list[tuple[list[str], int]]) -> list[list[SearchResult]]:
        """One search per distinct ``k`` over every query of the coalesced calls, split back per call."""
        out: list[list[SearchResult]] = [[] for _ in calls]
        for k in dict.fromkeys(k for _, k in calls):
            mine = [i for i, (_, ki) in enumerate(calls) if ki == k]
            results = await asyncio.to_thread(self.retriever.search_batch, [q for i in mine for q in calls[i][0]], k)
            self.batches += 1
            offset = 0
            for i in mine:
                out[i] = results[offset : offset + len(calls[i][0])]
                offset += len(calls[i][0])
        return out


def retrieval_app(config: RunConfig, index_path: str | Path):
    """The Serve application over an existing index (its manifest is checked here, before any replica starts)."""
    cfg = config.retrieval
    spec = encoder_spec(cfg)
    IndexDir(index_path, spec)
    return RetrievalDeployment.options(
        num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "resources": cfg.resources},
        max_ongoing_requests=2 * cfg.max_batch_size,  # one batch searching while the next one fills
        logging_config={"enable_access_log": False},  # a line per request floods the console under load
    ).bind(str(index_path), spec, search_params(cfg), cfg.search_threads, cfg.max_batch_size, cfg.max_wait_ms,
           cfg.top_k or DEFAULT_TOPK)  # fmt: skip


def deploy_retrieval(config: RunConfig, index_path: str | Path, host: str = "127.0.0.1", port: int = 8000) -> str:
    """Start Serve's HTTP proxy at ``host:port`` (on the connected Ray), run the application and wait
    until every replica has loaded the index; returns the base URL."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(retrieval_app(config, index_path), name=config.retrieval.deployment, route_prefix="/")
    return f"http://{host}:{port}"


def undeploy_retrieval(config: RunConfig) -> None:
    """Delete the application, then Serve itself (its proxy and controller) if nothing else runs on it."""
    try:
        serve.delete(config.retrieval.deployment)
    except RayServeException:  # Serve never started (the deployment failed first): nothing to delete
        return
    if not serve.status().applications:
        serve.shutdown()


class ServeRetriever:
    """The ``Retriever`` protocol over the deployment ``name`` on the connected Ray cluster (a Serve handle).
    Picklable: generation actors call the replicas directly."""

    def __init__(self, name: str):
        try:
            self.handle = serve.get_app_handle(name)
        except Exception as exc:  # noqa: BLE001 - Serve raises several types for "no such application"
            raise RetrievalServerError(
                f"no Ray Serve application {name!r} on this Ray cluster ({type(exc).__name__}: {exc}); start it with "
                "`raypipe serve-retrieval` and point ray.address at its cluster, or use retrieval.backend=http"
            ) from exc
        self.name = name

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        return await self.handle.search.remote(list(queries), k)

    def describe(self) -> dict[str, Any]:
        started = time.perf_counter()
        health = self.handle.health.remote().result(timeout_s=60)
        return {"backend": "serve", "deployment": self.name,
                "health": {**health, "seconds": round(time.perf_counter() - started, 3)}}  # fmt: skip

    def shutdown(self) -> None:
        """Nothing to stop: the deployment outlives the job."""
