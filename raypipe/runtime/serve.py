"""The retrieval service as a Ray Serve deployment speaking Search-R1's HTTP API.

``deploy_retrieval(config, index_path, host, port, token)`` runs the application ``retrieval.serve.deployment``:
``retrieval.actors.replicas`` replicas (``retrieval.actors.num_cpus`` / ``num_gpus`` / ``resources`` each), each holding
the index and query encoder exactly as an in-job :class:`~raypipe.runtime.retrieval.RetrievalActor`
does (same :func:`~raypipe.runtime.retrieval.open_replica`, so the same ids and scores), behind Serve's
HTTP proxy at ``http://HOST:PORT``:

- ``POST /retrieve``: Search-R1's request and response (``raypipe.retrieval.http_client``); a missing or
  zero ``topk`` falls back to ``retrieval.top_k`` (the agent protocol's default when the config leaves it out:
  Search-R1's 3, its server's ``--topk``), as Search-R1's server falls back to its ``--topk``.
- ``GET /health``: status, passages, encoder, the replica, its batch count and its limits (no file paths).
- raypipe's own corpus endpoints under ``/raypipe`` (:mod:`raypipe.runtime.corpus_service`: passage
  vectors, document frequencies per lexicon, query vectors, the corpus size), which the features stage
  needs besides searches; the same calls as handle methods. Search-R1's API has no such calls.

Concurrent requests (HTTP or handle) are coalesced by Serve's request batching (``@serve.batch``): up to
``retrieval.actors.max_batch_size`` requests, waiting at most ``retrieval.actors.max_wait_ms``, become one search call
per distinct ``topk``; a search that fails fails the requests of its ``topk`` only. Jobs on the same Ray
cluster can skip HTTP: :class:`~raypipe.runtime.serve_client.ServeRetriever` calls the deployment's
``search`` through a Serve handle (``retrieval.backend: serve``).

What one request may take is bounded (the ``retrieval.serve`` settings, :class:`~raypipe.core.config.ServeConfig`): its
queries, its ``topk`` (and never more than the passages indexed), its body's size, the ids, terms or texts
of a corpus call, and its time from arrival to answer. Each refusal is a 4xx whose JSON ``detail`` names
the setting (through a handle, a :class:`RequestError`). The corpus work runs in worker threads, so a big
corpus call does not hold up other clients' searches. With a token (``raypipe serve-retrieval --token``
or the environment variable :data:`~raypipe.core.http.TOKEN_ENV`) every HTTP request needs
``Authorization: Bearer TOKEN`` (401 otherwise); Serve handle calls come from inside the Ray cluster and
need none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve

from raypipe.core.config import RunConfig, ServeConfig
from raypipe.core.http import one_line
from raypipe.retrieval.build import encoder_spec, search_params
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.http_client import retrieve_response
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.types import SearchResult
from raypipe.runtime.corpus_service import PREFIX, CorpusMethods
from raypipe.runtime.retrieval import open_replica
from raypipe.runtime.service import RequestGate, replica_gate, start_proxy, undeploy_app, warn_if_open

log = logging.getLogger(__name__)
T = TypeVar("T")
SearchCall = tuple[list[str], int]


class RequestError(Exception):
    """A request answered with HTTP ``status`` and a one-line ``detail`` instead of its result (raised as
    such through a Serve handle)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def check_queries(limits: ServeConfig, count: int) -> None:
    if count > limits.max_queries:
        raise RequestError(
            413,
            f"{count} queries in one request, over this server's limit of {limits.max_queries} "
            "(retrieval.serve.max_queries): send them in smaller requests",
        )


def search_depth(limits: ServeConfig, topk: int, passages: int) -> int:
    """The depth searched for ``topk``: refused outside 1..max_topk, and never more than the passages indexed
    (FAISS allocates queries x depth)."""
    if not 1 <= topk <= limits.max_topk:
        raise RequestError(
            422, f"topk {topk} is outside 1..{limits.max_topk}, this server's range (retrieval.serve.max_topk)"
        )
    return min(topk, max(passages, 1))


def check_results(limits: ServeConfig, queries: int, depth: int) -> None:
    """Queries x the depth searched: the hits one request asks for (and FAISS allocates)."""
    if queries * depth > limits.max_results:
        raise RequestError(
            413,
            f"{queries} queries x depth {depth} = {queries * depth:,} hits in one request, over "
            f"this server's limit of {limits.max_results:,} (retrieval.serve.max_results): send fewer "
            "queries per request or a smaller topk",
        )


def check_items(limits: ServeConfig, field: str, count: int) -> None:
    if count > limits.max_items:
        raise RequestError(
            413,
            f"{count} {field} in one request, over this server's limit of {limits.max_items} "
            "(retrieval.serve.max_items): send them in chunks",
        )


api = FastAPI(title="raypipe retrieval", description="Search-R1's POST /retrieve over a raypipe index")
api.add_middleware(RequestGate, settings=replica_gate)


@api.exception_handler(RequestError)
async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, exc.status)


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


async def within_deadline(work: Awaitable[T], timeout_s: float) -> T:
    """``work``'s result, or a 408 :class:`RequestError` after ``timeout_s`` (the work is abandoned; a thread
    running it finishes unseen)."""
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:  # asyncio.TimeoutError is this builtin from Python 3.11
        raise RequestError(
            408,
            f"no answer within {timeout_s:g} s (retrieval.serve.timeout_s): the server is busy or the request too big",
        ) from None


async def search_by_topk(
    calls: list[SearchCall], search: Callable[[list[str], int], list[SearchResult]], max_results: int | None = None
) -> list[list[SearchResult] | Exception]:
    """``search`` (in a worker thread) per distinct ``k`` over every query of the calls with that ``k``, in calls
    of at most ``max_results`` hits (queries x ``k``; at least one query each), split back per call. A search that
    fails is the answer of its own calls only (those of its ``k``)."""
    out: list[list[SearchResult] | Exception] = [[] for _ in calls]
    for k in dict.fromkeys(k for _, k in calls):
        mine = [i for i, (_, ki) in enumerate(calls) if ki == k]
        queries = [q for i in mine for q in calls[i][0]]
        step = max(1, (max_results or len(queries) * k) // k)
        try:
            results = []
            for start in range(0, len(queries), step):
                results += await asyncio.to_thread(search, queries[start : start + step], k)
        except Exception as exc:  # noqa: BLE001 - the answer of this group's calls, raised to each
            for i in mine:
                out[i] = exc
            continue
        offset = 0
        for i in mine:
            out[i] = results[offset : offset + len(calls[i][0])]
            offset += len(calls[i][0])
    return out


@serve.deployment
@serve.ingress(api)
class RetrievalDeployment(CorpusMethods):
    """One replica: the searcher of an in-job retrieval actor, fed by Serve's request batching, and its
    corpus methods (handle calls ``corpus_info``, ``doc_vectors``, ``document_frequencies``,
    ``encode_queries``; HTTP under ``/raypipe``), each within the replica's ``limits`` (``retrieval.serve``)."""

    def __init__(
        self,
        index_path: str,
        spec: EncoderSpec,
        params: SearchParams,
        threads: int | None,
        max_batch_size: int,
        max_wait_ms: float,
        default_topk: int,
        limits: ServeConfig,
        token: str | None = None,
    ):
        self.retriever = open_replica(index_path, spec, params, threads)
        self.default_topk = default_topk
        self.limits = limits
        self.token = token
        self.batches = 0
        self._search_calls.set_max_batch_size(max_batch_size)
        self._search_calls.set_batch_wait_timeout_s(max_wait_ms / 1000)

    @api.post("/retrieve")
    async def retrieve(self, request: QueryRequest) -> dict[str, Any]:
        results = await self.search(request.queries, request.topk or self.default_topk)
        return retrieve_response(results, request.return_scores)

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "passages": self.retriever.index.ntotal,
            "encoder": self.retriever.encoder.name,
            "replica": serve.get_replica_context().replica_id.unique_id,
            "batches": self.batches,
            "corpus_endpoints": PREFIX,
            "limits": self.limits.model_dump(exclude={"deployment"}),
            "token": self.token is not None,
        }

    @api.get(f"{PREFIX}/corpus_info")
    async def corpus_info_endpoint(self) -> dict[str, Any]:
        return await self.corpus_info()

    @api.post(f"{PREFIX}/doc_vectors")
    async def doc_vectors_endpoint(self, request: DocVectorsRequest) -> JSONResponse:
        try:
            return vectors_response(await self.doc_vectors(request.doc_ids))
        except KeyError as exc:
            raise RequestError(400, f"unknown passage id: {exc}") from None

    @api.post(f"{PREFIX}/document_frequencies")
    async def document_frequencies_endpoint(self, request: FrequenciesRequest) -> dict[str, Any]:
        try:
            return {"df": await self.document_frequencies(request.terms, request.lexicon)}
        except (LookupError, ValueError, NotImplementedError) as exc:  # an unknown lexicon, or one this index lacks
            raise RequestError(400, f"{type(exc).__name__}: {exc}") from None

    @api.post(f"{PREFIX}/encode_queries")
    async def encode_queries_endpoint(self, request: EncodeRequest) -> JSONResponse:
        return vectors_response(await self.encode_queries(request.texts))

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """The ``Retriever`` call for Serve handles (:class:`~raypipe.runtime.serve_client.ServeRetriever`)
        and ``POST /retrieve``."""
        queries = list(queries)
        check_queries(self.limits, len(queries))
        depth = search_depth(self.limits, k, self.retriever.index.ntotal)
        check_results(self.limits, len(queries), depth)
        results = await within_deadline(self._search_calls((queries, depth)), self.limits.timeout_s)
        if isinstance(results, Exception):
            raise RequestError(500, f"the search failed: {type(results).__name__}: {one_line(str(results))}")
        return results

    async def corpus_info(self) -> dict[str, Any]:
        return await self._in_thread(self.corpus.corpus_info)

    async def doc_vectors(self, doc_ids: list[str]) -> Any:
        check_items(self.limits, "doc_ids", len(doc_ids))
        return await self._in_thread(self.corpus.doc_vectors, doc_ids)

    async def document_frequencies(self, terms: list[str], lexicon: str = "plain") -> list[int]:
        check_items(self.limits, "terms", len(terms))
        return await self._in_thread(self.corpus.document_frequencies, terms, lexicon)

    async def encode_queries(self, texts: list[str]) -> Any:
        check_items(self.limits, "texts", len(texts))
        return await self._in_thread(self.corpus.encode_queries, texts)

    async def _in_thread(self, work: Callable[..., T], *args: Any) -> T:
        """Blocking corpus work in a worker thread (the event loop goes on serving), within the deadline."""
        return await within_deadline(asyncio.to_thread(work, *args), self.limits.timeout_s)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)  # set from the config in __init__
    async def _search_calls(self, calls: list[SearchCall]) -> list[list[SearchResult] | Exception]:
        self.batches += len({k for _, k in calls})
        return await search_by_topk(calls, self.retriever.search_batch, self.limits.max_batch_results)


def retrieval_app(config: RunConfig, index_path: str | Path, token: str | None = None):
    """The Serve application over an existing index (its manifest is checked here, before any replica starts)."""
    cfg = config.retrieval
    spec = encoder_spec(cfg)
    IndexDir(index_path, spec)
    return RetrievalDeployment.options(
        num_replicas=cfg.actors.replicas,
        ray_actor_options={
            "num_cpus": cfg.actors.num_cpus,
            "num_gpus": cfg.actors.num_gpus,
            "resources": cfg.actors.resources,
        },
        max_ongoing_requests=2 * cfg.actors.max_batch_size,  # one batch searching while the next one fills
        logging_config={"enable_access_log": False},  # a line per request floods the console under load
    ).bind(
        str(index_path),
        spec,
        search_params(cfg),
        cfg.actors.search_threads,
        cfg.actors.max_batch_size,
        cfg.actors.max_wait_ms,
        cfg.top_k,
        cfg.serve,
        token,
    )


def deploy_retrieval(
    config: RunConfig, index_path: str | Path, host: str = "127.0.0.1", port: int = 8000, token: str | None = None
) -> str:
    """Start Serve's HTTP proxy at ``host:port`` (on the connected Ray), run the application and wait
    until every replica has loaded the index; returns the base URL. ``token``: the bearer token every
    HTTP request must carry (None: none)."""
    warn_if_open(
        host, port, token, "search the index and read its passages, vectors and term counts (docs/retrieval.md)"
    )
    start_proxy(host, port, config.retrieval.serve.timeout_s)
    serve.run(retrieval_app(config, index_path, token), name=config.retrieval.serve.deployment, route_prefix="/")
    return f"http://{host}:{port}"


def undeploy_retrieval(config: RunConfig) -> None:
    undeploy_app(config.retrieval.serve.deployment)
