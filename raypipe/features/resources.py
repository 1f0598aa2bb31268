"""What the signals need from outside a trajectory: two small interfaces and their implementations.

- :class:`CorpusResources`: the retrieval index's side: corpus statistics for IDF, the index's vectors
  for the documents, the index's query encoder, and a search for the original question's own list.
  :class:`IndexCorpus` adapts a retrieval index directory opened in-process (``raypipe.retrieval``);
  the features stage uses the retrieval service's ``ServiceCorpus`` (``raypipe.runtime.retrieval``);
  :class:`InMemoryCorpus` is a small brute-force implementation (tests, synthetic benchmarks).
- :class:`SentenceEncoder`: SBERT-style text embeddings for the similarity signals;
  :class:`SbertEncoder` loads a sentence-transformers model.

The loaders are plain Python: the features job's actors and the online controller both open them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from raypipe.core.config import RunConfig
from raypipe.data.loaders import Passage
from raypipe.retrieval.store import CorpusStats, tokenize

log = logging.getLogger(__name__)


class CorpusResources(Protocol):
    num_docs: int

    def terms(self, text: str) -> list[str]:
        """The query's terms, normalised as the document frequencies were counted."""
        ...

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        """Documents containing ``term`` in ``lexicon`` (0 when unknown): "plain", the statistics' own
        tokens (:meth:`terms`), or "terrier", Terrier's indexed terms (``raypipe.retrieval.store``)."""
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


class InMemoryCorpus:
    """Brute-force inner-product search over a dict of document vectors, with document frequencies
    counted from the documents' texts (both lexicons, as an index counts them)."""

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
        self.stats = CorpusStats.count(Passage(doc_id, "", texts[doc_id]) for doc_id in self._ids)
        self._encode = query_encoder
        self.num_docs = len(self._ids)

    def terms(self, text: str) -> list[str]:
        return tokenize(text)

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        return self.stats.df(term, lexicon)

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


class SbertEncoder:
    """A sentence-transformers model (embedded name or folder) as a :class:`SentenceEncoder`."""

    def __init__(self, ref: str = "minilm", batch_size: int = 64):
        from sentence_transformers import SentenceTransformer

        from raypipe.core.models import resolve_sentence_model

        self.model = SentenceTransformer(str(resolve_sentence_model(ref)), device="cpu", local_files_only=True)
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)


class OnnxSentenceEncoder:
    """The same sentence-transformers model exported to ONNX and run by ONNX Runtime on the CPU (the retrieval
    encoder's machinery, :class:`raypipe.retrieval.encoders.OnnxEncoder`: fp32, no prefix, its folder's
    ``max_seq_length``): the online controller's, several times cheaper per call than torch. Its vectors are
    normalised; the similarity signals are cosines, equal to :class:`SbertEncoder`'s to float precision."""

    def __init__(self, ref: str = "minilm", threads: int | None = None):
        from raypipe.core.models import resolve_sentence_model
        from raypipe.retrieval.encoders import EncoderSpec

        config = resolve_sentence_model(ref) / "sentence_bert_config.json"
        max_length = json.loads(config.read_text())["max_seq_length"] if config.exists() else 256
        spec = EncoderSpec(ref, prefixes="none", max_length=max_length, threads=threads, backend="onnx")
        self.encoder = spec.load()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode_passages(list(texts))


class IndexCorpus:
    """:class:`CorpusResources` over a retrieval index directory opened in this process
    (``raypipe.retrieval``): the online controller, benchmarks and tests. The features stage asks the
    retrieval service instead (``raypipe.runtime.retrieval.ServiceCorpus``), so that its actors hold no
    index of their own.

    Document vectors are read back from the FAISS index (exact for flat indexes, approximate for PQ;
    re-encoded where it cannot reconstruct, :class:`~raypipe.retrieval.searcher.StoredVectors`). IDF
    uses the index's corpus statistics and their tokeniser.
    """

    def __init__(self, retriever: Any):
        from raypipe.retrieval.searcher import StoredVectors

        self.retriever = retriever
        self.stats = retriever.index_dir.stats
        self.num_docs = int(self.stats.n_docs)
        self._vectors = StoredVectors(retriever)

    @classmethod
    def open(cls, config: RunConfig) -> IndexCorpus:
        from raypipe.retrieval.build import encoder_spec, index_dir_for, search_params
        from raypipe.retrieval.searcher import LocalRetriever

        path = index_dir_for(config)
        log.info("features: index %s", path)
        return cls(LocalRetriever.open(path, encoder_spec(config.retrieval), search_params(config.retrieval)))

    def terms(self, text: str) -> list[str]:
        return tokenize(text)

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        return self.stats.df(term, lexicon)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self._vectors.doc_vectors(doc_ids)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.retriever.encoder.encode_queries(list(texts))

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        return [[hit.doc_id for hit in result.hits] for result in self.retriever.search_batch(texts, k)]
