"""In-process retrieval over a loaded index directory (no Ray): the core the service actors wrap."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raypipe.retrieval.encoders import Encoder, EncoderSpec, passage_text
from raypipe.retrieval.index import IndexDir, SearchParams
from raypipe.retrieval.types import SearchHit, SearchResult

log = logging.getLogger(__name__)


class LocalRetriever:
    """Encodes queries and searches one FAISS index; implements the ``Retriever`` protocol.

    Empty or whitespace queries get ``SearchResult(query, [], empty_query=True)`` without a search.
    """

    def __init__(self, index_dir: IndexDir, encoder: Encoder, params: SearchParams | None = None):
        self.index_dir = index_dir
        self.encoder = encoder
        self.index = index_dir.faiss_index(params)
        self.docs = index_dir.docs

    @classmethod
    def open(cls, path: str | Path, spec: EncoderSpec, params: SearchParams | None = None) -> LocalRetriever:
        """Check the manifest against ``spec`` first (fails before loading anything), then load."""
        index_dir = IndexDir(path, spec)
        return cls(index_dir, spec.load(), params)

    def search_batch(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """One ranked list per query (best first, at most ``k`` hits), in order. FAISS is asked for at most
        the passages indexed: its result arrays are queries x k, so a huge ``k`` must not reach it."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        queries = list(queries)
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        results = [SearchResult(query=q, hits=[], empty_query=True) for q in queries]
        if not live:
            return results
        depth = max(1, min(k, self.index.ntotal))
        vectors = self.encoder.encode_queries([queries[i] for i in live])
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), depth)
        flat_ids = [int(j) for row in ids for j in row if j >= 0]
        passages = iter(self.docs.get(flat_ids))
        for row, i in enumerate(live):
            hits = []
            for score, j in zip(scores[row], ids[row]):
                if j < 0:  # fewer than k passages in the index
                    continue
                p = next(passages)
                hits.append(SearchHit(doc_id=p.doc_id, score=float(score), title=p.title, text=p.text))
            results[i] = SearchResult(query=queries[i], hits=hits)
        return results

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        return self.search_batch(queries, k)


class StoredVectors:
    """Passage vectors by passage id from a retriever's own index: ``reconstruct`` (exact for flat
    indexes, approximate for PQ), or, for an index that cannot reconstruct (e.g. on GPU), the passages
    re-encoded with the index's encoder."""

    def __init__(self, retriever: LocalRetriever):
        self.retriever = retriever
        self.reconstructs = _prepare_reconstruct(retriever.index)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        docs = self.retriever.docs
        rows = docs.rows_of(list(doc_ids))
        if not rows:
            return np.zeros((0, self.retriever.index.d), dtype=np.float32)
        if self.reconstructs:
            return np.stack([self.retriever.index.reconstruct(r) for r in rows]).astype(np.float32)
        return self.retriever.encoder.encode_passages([passage_text(p.title, p.text) for p in docs.get(rows)])


def _prepare_reconstruct(index) -> bool:
    """Prepare ``index`` for ``reconstruct``; False when it cannot reconstruct."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    try:
        if ivf is not None:
            ivf.make_direct_map()
        if index.ntotal:
            index.reconstruct(0)
    except RuntimeError:
        log.info("the index cannot reconstruct vectors; passages are re-encoded instead")
        return False
    return True
