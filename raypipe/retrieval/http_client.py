"""A client for any retrieval server that speaks Search-R1's HTTP API (``retrieval.backend: http``).

The API (PeterGriffinJin/Search-R1 ``search_r1/search/retrieval_server.py``, ``QueryRequest`` and
``retrieve_endpoint``)::

    POST /retrieve  {"queries": ["q1", ...], "topk": k, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

one ranked list per query, in order. :class:`HttpRetriever` implements the ``Retriever`` protocol over
it: concurrent ``search`` calls (one per trajectory) are coalesced into batched POSTs by a
:class:`~raypipe.retrieval.batcher.QueryBatcher` (``retrieval.actors.max_batch_size`` / ``max_wait_ms``, as in
the in-job service); each request has a deadline for the whole exchange (connect, send, the whole
answer), a ceiling on the answer's size, and is retried with backoff on connection errors, timeouts and
5xx/408/429 answers. What still fails raises :class:`RetrievalServerError` (one line, for the user), which
the agent loop records on the row as ``retrieval_error`` with the message; the job goes on. An answer
that is not what the API promises (not JSON, another JSON type, missing fields, another number of lists)
is a :class:`RetrievalResponseError`, never a ``TypeError`` or ``KeyError``. A server started with a
token (``raypipe serve-retrieval --token``) gets it from :data:`~raypipe.core.http.TOKEN_ENV` as a bearer token.
``contents`` is split into title and text as the bundled corpus is
(:func:`raypipe.data.loaders.split_contents`). Empty or whitespace queries are answered here, without a
request, exactly as the in-job searcher answers them (no hits, ``empty_query=True``). Standard library
only; the client is picklable.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from raypipe.core.config import ConfigError
from raypipe.core.http import TOKEN_ENV, one_line
from raypipe.data.loaders import split_contents
from raypipe.retrieval.batcher import QueryBatcher
from raypipe.retrieval.encoders import passage_text
from raypipe.retrieval.types import SearchHit, SearchResult

MAX_BACKOFF_S = 8.0  # ceiling of the exponential backoff between retries
HEALTH_QUERY = "health check"  # the first call made when a server has no GET /health (Search-R1's has none)
DEFAULT_MAX_RESPONSE_BYTES = 64 * 2**20
READ_CHUNK = 2**16
NO_ENDPOINT = (404, 405, 501)  # what a server without an endpoint answers


class RetrievalServerError(RuntimeError):
    """The retrieval server failed, stayed unreachable, or refused the request."""


class RetrievalResponseError(RetrievalServerError):
    """A response that is not in Search-R1's format (not retried: the server would answer the same)."""


class RetrievalHTTPError(RetrievalServerError):
    """The server answered an HTTP error ``status``; ``detail`` is the start of its body, on one line."""

    def __init__(self, message: str, status: int, detail: str):
        super().__init__(message)
        self.status, self.detail = status, detail

    @property
    def retried(self) -> bool:
        """Worth sending again: the server failed (5xx), ran out of time (408) or is overloaded (429)."""
        return self.status >= 500 or self.status in (408, 429)


def base_url(url: str) -> str:
    """``http://host:port`` from a URL given with or without a trailing ``/`` or ``/retrieve``."""
    url = url.strip().rstrip("/")
    if url.endswith("/retrieve"):
        url = url[: -len("/retrieve")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"retrieval.http.url must start with http:// or https://, got {url!r}")
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
        raise RetrievalResponseError(
            f"query {query!r}: expected {{'document': ..., 'score': ...}}, got {_preview(item)}"
        )
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RetrievalResponseError(f"query {query!r}: hit without a numeric score: {_preview(item)}")
    doc_id, contents = document.get("id"), document.get("contents")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not isinstance(contents, str):
        raise RetrievalResponseError(
            f"query {query!r}: document needs an 'id' and a 'contents' string: {_preview(document)}"
        )
    title, text = split_contents(contents)
    return SearchHit(doc_id=str(doc_id), score=float(score), title=title, text=text)


def _preview(value: Any, limit: int = 200) -> str:
    text = json.dumps(value) if not isinstance(value, (str, bytes)) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def decode_json_object(raw: bytes, what: str) -> dict[str, Any]:
    """The JSON object ``raw`` holds; anything else (not JSON, a list, a number) is a
    :class:`RetrievalResponseError`."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RetrievalResponseError(f"{what}: not JSON ({exc}): {_preview(raw[:200])}") from None
    if not isinstance(body, dict):
        raise RetrievalResponseError(f"{what}: expected a JSON object, got {_preview(body)}")
    return body


def fetch(url: str, data: bytes | None, headers: dict[str, str], timeout_s: float, max_bytes: int) -> bytes:
    """One HTTP exchange (POST ``data``, or GET without) within a total deadline of ``timeout_s``: a watchdog
    shuts the socket at the deadline, so a server that answers a byte at a time cannot stretch it as it can
    a timeout per socket operation. The body, at most ``max_bytes``.

    Raises :class:`RetrievalHTTPError` for a status >= 400, :class:`RetrievalResponseError` for a longer body,
    ``TimeoutError`` at the deadline, ``OSError`` / ``http.client.HTTPException`` when the connection fails.
    """
    parts = urllib.parse.urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.netloc, timeout=timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    expired = threading.Event()
    sockets: list[socket.socket] = []  # the connection's socket (the response keeps it when the connection lets go)

    def cut() -> None:  # a blocked read returns at once when its socket is shut
        expired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass

    watchdog = threading.Timer(timeout_s, cut)
    watchdog.daemon = True
    watchdog.start()
    response: http.client.HTTPResponse | None = None
    try:
        connection.connect()
        sockets.append(connection.sock)
        if expired.is_set():  # the deadline passed while connecting
            raise TimeoutError
        connection.request("GET" if data is None else "POST", path, body=data, headers=headers)
        response = connection.getresponse()
        if response.status >= 400:
            detail = one_line(response.read(300).decode(errors="replace"))
            raise RetrievalHTTPError(f"HTTP {response.status}: {detail}", response.status, detail)
        body = _read_at_most(response, max_bytes)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise TimeoutError(f"no complete answer within {timeout_s:g} s") from exc
        raise
    finally:
        watchdog.cancel()
        if response is not None:
            response.close()
        connection.close()
    if expired.is_set():  # an answer without a length, cut short at the deadline
        raise TimeoutError(f"no complete answer within {timeout_s:g} s")
    return body


def _read_at_most(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    length = response.getheader("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise RetrievalResponseError(f"an answer of {int(length):,} bytes, over the limit of {max_bytes:,}")
    chunks, size = [], 0
    while chunk := response.read(READ_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise RetrievalResponseError(f"an answer over the limit of {max_bytes:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class HttpRetriever:
    """The ``Retriever`` protocol over a Search-R1-style server at ``url`` (see the module docstring).

    ``token``: sent as ``Authorization: Bearer`` (default: the :data:`~raypipe.core.http.TOKEN_ENV` environment
    variable, read when the client is made, so the client carries it to the actors it is pickled to)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        retries: int = 3,
        max_batch_size: int = 64,
        max_wait_ms: float = 5.0,
        backoff_s: float = 0.5,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        token: str | None = None,
    ):
        self.url = base_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.backoff_s = backoff_s
        self.max_response_bytes = max_response_bytes
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self._batcher: QueryBatcher | None = None  # made on first use, in the caller's event loop

    @classmethod
    def from_config(cls, retrieval) -> HttpRetriever:
        """From a ``RetrievalConfig`` (``url``, ``http_timeout_s``, ``http_retries``, ``http_max_response_bytes``,
        batching settings)."""
        if not retrieval.http.url:
            raise ConfigError(
                "retrieval.backend=http needs retrieval.http.url, e.g. --set retrieval.http.url=http://127.0.0.1:8000"
            )
        return cls(
            retrieval.http.url,
            retrieval.http.timeout_s,
            retrieval.http.retries,
            retrieval.actors.max_batch_size,
            retrieval.actors.max_wait_ms,
            max_response_bytes=retrieval.http.max_response_bytes,
        )

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
            answer = self.request_json("/retrieve", retrieve_payload(asked, k))
            for i, result in zip(live, parse_retrieve_response(answer, asked, k)):
                results[i] = result
        return results

    def health(self) -> dict[str, Any]:
        """What the server says about itself: its ``GET /health`` answer, or, where it has none (Search-R1's
        server), the outcome of a one-query ``POST /retrieve``. Raises :class:`RetrievalServerError`."""
        try:
            return {"endpoint": "GET /health", **self.request_json("/health")}
        except RetrievalHTTPError as exc:
            if exc.status not in NO_ENDPOINT:
                raise
        started = time.perf_counter()
        answer = self.request_json("/retrieve", retrieve_payload([HEALTH_QUERY], 1))
        result = parse_retrieve_response(answer, [HEALTH_QUERY], 1)[0]
        return {
            "endpoint": "POST /retrieve",
            "status": "ok",
            "hits": len(result.hits),
            "seconds": round(time.perf_counter() - started, 3),
        }

    def describe(self) -> dict[str, Any]:
        """For the run's info: where searches go and what the server reported."""
        return {"backend": "http", "url": self.url, "health": self.health()}

    def shutdown(self) -> None:
        """Nothing to stop: the server is not the job's."""
        self._batcher = None

    def request_json(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """``POST`` ``body`` (or ``GET`` without one) to ``path`` on the server; its JSON object answer.

        Each try has the deadline ``timeout_s`` and reads at most ``max_response_bytes``; connection
        errors, timeouts and 5xx/408/429 answers are tried again (``retries``, exponential backoff).
        Raises :class:`RetrievalHTTPError` for another HTTP error, :class:`RetrievalResponseError` for an
        answer that is no JSON object or too long, :class:`RetrievalServerError` when every try failed."""
        url = f"{self.url}{path}"
        what = f"{'GET' if body is None else 'POST'} {url}"
        data = None if body is None else json.dumps(body).encode()
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                raw = fetch(url, data, self._headers(), self.timeout_s, self.max_response_bytes)
            except RetrievalHTTPError as exc:
                if not exc.retried:
                    raise RetrievalHTTPError(f"{what}: {exc}{_hint(exc.status)}", exc.status, exc.detail) from None
                last = exc
                continue
            except RetrievalResponseError as exc:
                raise RetrievalResponseError(f"{what}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
                last = exc
                continue
            return decode_json_object(raw, what)
        reason = f"{type(last).__name__}: {last}" if not isinstance(last, RetrievalServerError) else str(last)
        raise RetrievalServerError(f"{what} failed {self.retries + 1} time(s); last: {one_line(reason)}")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


def _hint(status: int) -> str:
    if status in (401, 403):
        return f" (the server wants a token: set {TOKEN_ENV} to the one it was started with)"
    return ""
