"""What the signals need from outside a trajectory, as two small interfaces.

- :class:`CorpusResources`: the retrieval index's side: corpus statistics for IDF, the index's vectors
  for the documents, the index's query encoder, and a search for the original question's own list.
  ``raypipe.stages.features`` adapts the retrieval package's index directory to it;
  :class:`InMemoryCorpus` is a small brute-force implementation (tests, synthetic benchmarks).
- :class:`SentenceEncoder`: SBERT-style text embeddings for the similarity signals.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np


class CorpusResources(Protocol):
    num_docs: int

    def terms(self, text: str) -> list[str]:
        """The query's terms, normalised as the document frequencies were counted."""
        ...

    def document_frequency(self, term: str) -> int:
        """Documents containing ``term`` (0 when unknown)."""
        ...

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        """The documents' vectors in the index's space, one row per id, in order."""
        ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query vectors from the index's own query encoder (with its query prefix)."""
        ...

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        """The top-``k`` document ids for each text, best first."""
        ...


class SentenceEncoder(Protocol):
    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


_TOKEN = re.compile(r"\w+")


def simple_terms(text: str) -> list[str]:
    """Lower-cased word tokens (the tokeniser of :class:`InMemoryCorpus`)."""
    return _TOKEN.findall(text.lower())


class InMemoryCorpus:
    """Brute-force inner-product search over a dict of document vectors, with document frequencies
    counted from the documents' texts."""

    def __init__(
        self,
        vectors: Mapping[str, np.ndarray],
        texts: Mapping[str, str],
        query_encoder: Callable[[Sequence[str]], np.ndarray],
    ):
        if set(vectors) != set(texts):
            raise ValueError("InMemoryCorpus: vectors and texts must cover the same document ids")
        self._ids = list(vectors)
        self._row = {doc_id: i for i, doc_id in enumerate(self._ids)}
        self._matrix = np.vstack([np.asarray(vectors[d], dtype=np.float32) for d in self._ids])
        self._df = Counter(term for doc_id in self._ids for term in set(simple_terms(texts[doc_id])))
        self._encode = query_encoder
        self.num_docs = len(self._ids)

    def terms(self, text: str) -> list[str]:
        return simple_terms(text)

    def document_frequency(self, term: str) -> int:
        return self._df.get(term, 0)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        missing = [d for d in doc_ids if d not in self._row]
        if missing:
            raise KeyError(f"unknown document ids: {missing[:5]}")
        return self._matrix[[self._row[d] for d in doc_ids]]

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._encode(list(texts)), dtype=np.float32)

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        scores = self.encode_queries(texts) @ self._matrix.T
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[self._ids[j] for j in row] for row in order]
