"""The corpus side of the retrieval service: what the features stage needs from the index besides searches.

The trajectory signals (:mod:`raypipe.features`) need the index's passage vectors, its document
frequencies (in a lexicon: ``plain`` tokens or ``terrier`` stems), its query encoder and searches. A
features actor loads no index of its own: it asks a retrieval service, whichever ``retrieval.backend``
runs it.

- :class:`CorpusAnswers`: the answers over one loaded replica searcher (plain Python, no Ray), used by
  the in-job :class:`~raypipe.runtime.retrieval.RetrievalActor` and the Serve
  :class:`~raypipe.runtime.serve.RetrievalDeployment` alike (through :class:`CorpusMethods`, their async
  methods), so both give the same vectors and frequencies.
- The deployment also answers them over HTTP, next to Search-R1's ``POST /retrieve`` (untouched), under
  :data:`PREFIX` (JSON; vectors as lists of floats, exact)::

      GET  /raypipe/corpus_info                                  -> {"n_docs", "dimension", "passages", "encoder"}
      POST /raypipe/doc_vectors           {"doc_ids": [...]}      -> {"vectors": [[...], ...], "dimension"}
      POST /raypipe/document_frequencies  {"terms": [...], "lexicon": "plain"} -> {"df": [...]}
      POST /raypipe/encode_queries        {"texts": [...]}        -> {"vectors": [[...], ...], "dimension"}

- :class:`ServiceCorpus`: the features' ``CorpusResources`` over a :class:`CorpusTransport`, one per
  backend: :class:`ReplicaTransport` (``actors``: the job's replicas), :class:`ServeTransport`
  (``serve``: a Serve handle to ``retrieval.serve.deployment``), :class:`HttpTransport` (``http``: a
  ``raypipe serve-retrieval`` deployment at ``retrieval.http.url``); the job's service picks its own
  (:func:`raypipe.runtime.retrieval.corpus_transport`). Searches (the question's own list) go through the
  backend's search, as the probe job's do.

A plain Search-R1 retrieval server answers ``POST /retrieve`` only: ranked ids, scores and texts, but
neither the index's vectors nor its document frequencies, and these cannot be rebuilt honestly from
its answers (the encoder behind it is unknown, and frequencies need the whole corpus). Pointed at one,
the features stage stops at start with :class:`CorpusServiceError` saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from raypipe.retrieval.http_client import NO_ENDPOINT, HttpRetriever, RetrievalHTTPError, RetrievalServerError
from raypipe.retrieval.store import tokenize
from raypipe.retrieval.types import SearchResult

if TYPE_CHECKING:
    from raypipe.runtime.serve_client import ServeRetriever

PREFIX = "/raypipe"  # raypipe's own HTTP endpoints on the deployment, beside Search-R1's /retrieve
HTTP_CHUNK = 512  # ids or texts per HTTP request (a chunk of 768-d vectors is about 8 MB of JSON)
ENDPOINTS = ("corpus_info", "doc_vectors", "document_frequencies", "encode_queries")


class CorpusServiceError(RetrievalServerError):
    """The retrieval service cannot answer the corpus calls the features stage needs."""


class CorpusAnswers:
    """Corpus answers over a loaded replica searcher (a :class:`~raypipe.retrieval.searcher.LocalRetriever`).

    The statistics and the vector reader are loaded on first use (an IVF index builds its direct map
    then), so a replica that only searches pays nothing for them."""

    def __init__(self, retriever: Any):
        self.retriever = retriever

    @cached_property
    def stats(self):
        return self.retriever.index_dir.stats

    @cached_property
    def vectors(self):
        from raypipe.retrieval.searcher import StoredVectors

        return StoredVectors(self.retriever)

    def corpus_info(self) -> dict[str, Any]:
        """``n_docs`` (the statistics' passage count), the vector dimension, passages indexed, the encoder."""
        return {
            "n_docs": int(self.stats.n_docs),
            "dimension": int(self.retriever.index.d),
            "passages": int(self.retriever.index.ntotal),
            "encoder": self.retriever.encoder.name,
        }

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of passage ids, one float32 row per id, in order (KeyError if one is unknown)."""
        return np.asarray(self.vectors.doc_vectors(list(doc_ids)), dtype=np.float32)

    def document_frequencies(self, terms: Sequence[str], lexicon: str = "plain") -> list[int]:
        """Passages containing each (already normalised) term in ``lexicon``; 0 for an unknown term."""
        return [int(df) for df in self.stats.document_frequencies(list(terms), lexicon)]

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query vectors from the index's own query encoder (with its query prefix)."""
        return np.asarray(self.retriever.encoder.encode_queries(list(texts)), dtype=np.float32)


class CorpusMethods:
    """The corpus calls as async methods of a replica holding ``self.retriever``: Ray actor methods of the
    in-job replicas, Serve handle methods of the deployment. Vectors run in a worker thread, so that the
    replica's search batching goes on meanwhile."""

    retriever: Any

    @cached_property
    def corpus(self) -> CorpusAnswers:
        return CorpusAnswers(self.retriever)

    async def corpus_info(self) -> dict[str, Any]:
        return self.corpus.corpus_info()

    async def doc_vectors(self, doc_ids: list[str]) -> np.ndarray:
        return await asyncio.to_thread(self.corpus.doc_vectors, doc_ids)

    async def document_frequencies(self, terms: list[str], lexicon: str = "plain") -> list[int]:
        return self.corpus.document_frequencies(terms, lexicon)

    async def encode_queries(self, texts: list[str]) -> np.ndarray:
        return await asyncio.to_thread(self.corpus.encode_queries, texts)


class CorpusTransport(Protocol):
    """How a :class:`ServiceCorpus` reaches a retrieval service (blocking calls, from a features actor)."""

    def corpus_info(self) -> dict[str, Any]: ...

    def doc_vectors(self, doc_ids: list[str]) -> np.ndarray: ...

    def document_frequencies(self, terms: list[str], lexicon: str) -> list[int]: ...

    def encode_queries(self, texts: list[str]) -> np.ndarray: ...

    def search(self, texts: list[str], k: int) -> list[SearchResult]: ...


class MethodTransport:
    """A transport whose calls are the service's methods of the same names (:meth:`_call`)."""

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def corpus_info(self) -> dict[str, Any]:
        return self._call("corpus_info")

    def doc_vectors(self, doc_ids: list[str]) -> np.ndarray:
        return self._call("doc_vectors", doc_ids)

    def document_frequencies(self, terms: list[str], lexicon: str) -> list[int]:
        return self._call("document_frequencies", terms, lexicon)

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self._call("encode_queries", texts)

    def search(self, texts: list[str], k: int) -> list[SearchResult]:
        return self._call("search", texts, k)


class ReplicaTransport(MethodTransport):
    """``actors``: the job's retrieval replicas (a :class:`~raypipe.runtime.retrieval.RetrievalClient`),
    round robin. Picklable."""

    def __init__(self, client: Any):
        self.client = client
        self._next = 0

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        actor = self.client.actors[self._next % len(self.client.actors)]
        self._next += 1
        return ray.get(getattr(actor, method).remote(*args))


class ServeTransport(MethodTransport):
    """``serve``: the deployment's handle methods (:class:`~raypipe.runtime.serve_client.ServeRetriever`'s
    handle; its search is the one the probe job's agents call). Picklable."""

    def __init__(self, retriever: ServeRetriever, timeout_s: float = 600.0):
        self.retriever = retriever
        self.timeout_s = timeout_s

    def _call(self, method: str, *args: Any) -> Any:
        return getattr(self.retriever.handle, method).remote(*args).result(timeout_s=self.timeout_s)


class HttpTransport:
    """``http``: :data:`PREFIX` endpoints of a ``raypipe serve-retrieval`` deployment at the
    :class:`~raypipe.retrieval.http_client.HttpRetriever`'s URL, through its ``request_json`` (token, deadline,
    response size limit, retries of connection errors, timeouts and 5xx/408/429); searches are its
    ``POST /retrieve``. Long lists go in chunks of :data:`HTTP_CHUNK`. Picklable."""

    def __init__(self, retriever: HttpRetriever, chunk: int = HTTP_CHUNK):
        self.retriever = retriever
        self.chunk = chunk

    def corpus_info(self) -> dict[str, Any]:
        return self._request("corpus_info")

    def doc_vectors(self, doc_ids: list[str]) -> np.ndarray:
        return self._vectors("doc_vectors", "doc_ids", doc_ids)

    def document_frequencies(self, terms: list[str], lexicon: str) -> list[int]:
        out: list[int] = []
        for start in range(0, len(terms), self.chunk):
            part = terms[start : start + self.chunk]
            df = self._request("document_frequencies", {"terms": part, "lexicon": lexicon}).get("df")
            if not isinstance(df, list) or len(df) != len(part):
                raise CorpusServiceError(f"{self._url('document_frequencies')}: expected {len(part)} frequencies")
            out += [int(v) for v in df]
        return out

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self._vectors("encode_queries", "texts", texts)

    def search(self, texts: list[str], k: int) -> list[SearchResult]:
        return self.retriever.search_batch(texts, k)

    def _vectors(self, endpoint: str, field: str, items: list[str]) -> np.ndarray:
        parts = []
        for start in range(0, max(len(items), 1), self.chunk):
            part = items[start : start + self.chunk]
            body = self._request(endpoint, {field: part})
            try:
                parts.append(np.asarray(body["vectors"], dtype=np.float32).reshape(len(part), int(body["dimension"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise CorpusServiceError(f"{self._url(endpoint)}: expected {len(part)} vectors ({exc})") from None
        return np.concatenate(parts)

    def _url(self, endpoint: str) -> str:
        return f"{self.retriever.url}{PREFIX}/{endpoint}"

    def _request(self, endpoint: str, body: dict | None = None) -> dict[str, Any]:
        """One call through the HTTP client: its token, deadline, size limit and retries."""
        try:
            return self.retriever.request_json(f"{PREFIX}/{endpoint}", body)
        except RetrievalHTTPError as exc:
            if exc.status in NO_ENDPOINT:
                missing = f"{'GET' if body is None else 'POST'} {PREFIX}/{endpoint}"
                raise CorpusServiceError(not_raypipe_message(self.retriever.url, missing, exc.status)) from None
            raise CorpusServiceError(str(exc)) from None
        except RetrievalServerError as exc:
            raise CorpusServiceError(str(exc)) from None


def not_raypipe_message(url: str, call: str, status: int) -> str:
    return (
        f"the retrieval server at {url} has no {call} (HTTP {status}): it is not raypipe's retrieval deployment. "
        "The features stage needs the index's passage vectors and document frequencies, which Search-R1's "
        "POST /retrieve does not give (ranked ids, scores and texts only). Point retrieval.http.url at `raypipe "
        "serve-retrieval` over the same index, or run the features with --set retrieval.backend=actors "
        "(replicas over the local index the run's config names)."
    )


class ServiceCorpus:
    """The features' ``CorpusResources`` answered by a retrieval service (see the module docstring):
    document vectors, document frequencies (fetched for a whole batch's terms with
    :meth:`prefetch_terms`, cached per lexicon), the index's query encoder and the question's own list,
    in batched calls, so a features actor holds no index. Constructing it asks ``corpus_info`` (a
    server without the corpus endpoints fails here, with :class:`CorpusServiceError`)."""

    def __init__(self, transport: CorpusTransport):
        self.transport = transport
        self.info = transport.corpus_info()
        self.num_docs = int(self.info["n_docs"])
        self.dimension = int(self.info["dimension"])
        self._df: dict[tuple[str, str], int] = {}

    def terms(self, text: str) -> list[str]:
        return tokenize(text)

    def prefetch_terms(self, terms: Sequence[str], lexicon: str = "plain") -> None:
        """Fetch the document frequencies of ``terms`` in ``lexicon`` (those not fetched before) in one call."""
        wanted = list(dict.fromkeys(t for t in terms if (lexicon, t) not in self._df))
        if wanted:
            dfs = self.transport.document_frequencies(wanted, lexicon)
            self._df.update(((lexicon, t), int(df)) for t, df in zip(wanted, dfs))

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        if (lexicon, term) not in self._df:
            self.prefetch_terms([term], lexicon)
        return self._df[(lexicon, term)]

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        if not doc_ids:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.asarray(self.transport.doc_vectors(list(doc_ids)), dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.asarray(self.transport.encode_queries(list(texts)), dtype=np.float32)

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        results = self.transport.search(list(texts), k)
        return [[hit.doc_id for hit in result.hits] for result in results]
