"""A client for any retrieval server that speaks Search-R1's HTTP API (``retrieval.backend: http``).

The API (PeterGriffinJin/Search-R1 ``search_r1/search/retrieval_server.py``, ``QueryRequest`` and
``retrieve_endpoint``)::

    POST /retrieve  {"queries": ["q1", ...], "topk": k, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

one ranked list per query, in order. :class:`HttpRetriever` implements the ``Retriever`` protocol over
it: concurrent ``search`` calls (one per trajectory) are coalesced into batched POSTs by a
:class:`~raypipe.retrieval.batcher.QueryBatcher` (``retrieval.max_batch_size`` / ``max_wait_ms``, as in
the in-job service); each POST has a timeout and is retried with backoff on connection errors,
timeouts and 5xx/429 answers. What still fails raises :class:`RetrievalServerError`, which the agent
loop records on the row as ``retrieval_error`` with the message; the job goes on. ``contents`` is split
into title and text as the bundled corpus is (:func:`raypipe.data.loaders.split_contents`). Empty or
whitespace queries are answered here, without a request, exactly as the in-job searcher answers them
(no hits, ``empty_query=True``). Standard library only; the client is picklable.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from raypipe.core.config import ConfigError
from raypipe.data.loaders import split_contents
from raypipe.retrieval.batcher import QueryBatcher
from raypipe.retrieval.encoders import passage_text
from raypipe.retrieval.types import SearchHit, SearchResult

MAX_BACKOFF_S = 8.0  # ceiling of the exponential backoff between retries
HEALTH_QUERY = "health check"  # the first call made when a server has no GET /health (Search-R1's has none)


class RetrievalServerError(RuntimeError):
    """The retrieval server failed, stayed unreachable, or refused the request."""


class RetrievalResponseError(RetrievalServerError):
    """A response that is not in Search-R1's format (not retried: the server would answer the same)."""


def base_url(url: str) -> str:
    """``http://host:port`` from a URL given with or without a trailing ``/`` or ``/retrieve``."""
    url = url.strip().rstrip("/")
    if url.endswith("/retrieve"):
        url = url[: -len("/retrieve")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"retrieval.url must start with http:// or https://, got {url!r}")
    return url


def retrieve_payload(queries: Sequence[str], k: int) -> dict[str, Any]:
    """The request body: the deep list (``k``) with scores."""
    return {"queries": list(queries), "topk": k, "return_scores": True}


def parse_retrieve_response(body: Any, queries: Sequence[str], k: int) -> list[SearchResult]:
    """One :class:`SearchResult` per query from a decoded response; at most ``k`` hits each."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list):
        raise RetrievalResponseError(f"expected an object with a 'result' list, got {_preview(body)}")
    if len(result) != len(queries):
        raise RetrievalResponseError(f"{len(queries)} queries sent, {len(result)} result lists received")
    out = []
    for query, ranked in zip(queries, result):
        if not isinstance(ranked, list):
            raise RetrievalResponseError(f"query {query!r}: expected a list of hits, got {_preview(ranked)}")
        out.append(SearchResult(query=query, hits=[_hit(item, query) for item in ranked[:k]]))
    return out


def retrieve_response(results: Sequence[SearchResult], return_scores: bool) -> dict[str, Any]:
    """The response body a server sends (the inverse of :func:`parse_retrieve_response`): documents as
    ``{"id", "contents"}`` with ``contents`` rebuilt as the corpus line had it; without scores, the
    documents alone (as ``retrieve_endpoint`` answers)."""
    lists = []
    for result in results:
        docs = [{"id": h.doc_id, "contents": passage_text(h.title, h.text)} for h in result.hits]
        lists.append([{"document": d, "score": h.score} for d, h in zip(docs, result.hits)] if return_scores else docs)
    return {"result": lists}


def _hit(item: Any, query: str) -> SearchHit:
    document = item.get("document") if isinstance(item, dict) else None
    score = item.get("score") if isinstance(item, dict) else None
    if not isinstance(document, dict):
        raise RetrievalResponseError(f"query {query!r}: expected {{'document': ..., 'score': ...}}, got {_preview(item)}")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RetrievalResponseError(f"query {query!r}: hit without a numeric score: {_preview(item)}")
    doc_id, contents = document.get("id"), document.get("contents")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not isinstance(contents, str):
        raise RetrievalResponseError(f"query {query!r}: document needs an 'id' and a 'contents' string: {_preview(document)}")
    title, text = split_contents(contents)
    return SearchHit(doc_id=str(doc_id), score=float(score), title=title, text=text)


def _preview(value: Any, limit: int = 200) -> str:
    text = json.dumps(value) if not isinstance(value, (str, bytes)) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class HttpRetriever:
    """The ``Retriever`` protocol over a Search-R1-style server at ``url`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        retries: int = 3,
        max_batch_size: int = 64,
        max_wait_ms: float = 5.0,
        backoff_s: float = 0.5,
    ):
        self.url = base_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.backoff_s = backoff_s
        self._batcher: QueryBatcher | None = None  # made on first use, in the caller's event loop

    @classmethod
    def from_config(cls, retrieval) -> "HttpRetriever":
        """From a ``RetrievalConfig`` (``url``, ``http_timeout_s``, ``http_retries``, batching settings)."""
        if not retrieval.url:
            raise ConfigError("retrieval.backend=http needs retrieval.url, e.g. --set retrieval.url=http://127.0.0.1:8000")
        return cls(retrieval.url, retrieval.http_timeout_s, retrieval.http_retries, retrieval.max_batch_size,
                   retrieval.max_wait_ms)  # fmt: skip

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_batcher": None}  # a batcher belongs to one process and event loop

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        if self._batcher is None:
            self._batcher = QueryBatcher(self.search_batch, self.max_batch_size, self.max_wait_ms / 1000)
        return await self._batcher.search(queries, k)

    def search_batch(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """One blocking POST for the non-empty queries (retried as configured); results in query order."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        queries = list(queries)
        results = [SearchResult(query=q, hits=[], empty_query=True) for q in queries]
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        if live:
            asked = [queries[i] for i in live]
            for i, result in zip(live, parse_retrieve_response(self._post_retrieve(asked, k), asked, k)):
                results[i] = result
        return results

    def health(self) -> dict[str, Any]:
        """What the server says about itself: its ``GET /health`` answer, or, where it has none (Search-R1's
        server), the outcome of a one-query ``POST /retrieve``. Raises :class:`RetrievalServerError`."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=self.timeout_s) as response:
                return {"endpoint": "GET /health", **_json_object(response.read())}
        except urllib.error.HTTPError as exc:
            if exc.code not in (404, 405, 501):  # no such endpoint
                raise RetrievalServerError(f"GET {self.url}/health: HTTP {exc.code}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise RetrievalServerError(f"GET {self.url}/health: {type(exc).__name__}: {exc}") from exc
        started = time.perf_counter()
        result = parse_retrieve_response(self._post_retrieve([HEALTH_QUERY], 1), [HEALTH_QUERY], 1)[0]
        return {"endpoint": "POST /retrieve", "status": "ok", "hits": len(result.hits),
                "seconds": round(time.perf_counter() - started, 3)}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        """For the run's info: where searches go and what the server reported."""
        return {"backend": "http", "url": self.url, "health": self.health()}

    def shutdown(self) -> None:
        """Nothing to stop: the server is not the job's."""
        self._batcher = None

    def _post_retrieve(self, queries: list[str], k: int) -> Any:
        data = json.dumps(retrieve_payload(queries, k)).encode()
        endpoint = f"{self.url}/retrieve"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            request = urllib.request.Request(endpoint, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode(errors="replace")
                if exc.code < 500 and exc.code != 429:
                    raise RetrievalServerError(f"POST {endpoint}: HTTP {exc.code}: {detail}") from exc
                last = RetrievalServerError(f"HTTP {exc.code}: {detail}")
                continue
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
                last = exc
                continue
            return _json_object(raw)
        reason = f"{type(last).__name__}: {last}" if not isinstance(last, RetrievalServerError) else str(last)
        raise RetrievalServerError(f"POST {endpoint} failed {self.retries + 1} time(s); last: {reason}")


def _json_object(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RetrievalResponseError(f"not JSON ({exc}): {_preview(raw[:200])}") from None
