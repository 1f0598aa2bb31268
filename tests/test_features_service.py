"""The features stage's corpus from a retrieval service (raypipe.runtime.corpus_service): batched, cached
calls per lexicon, and a clear refusal of a server that only speaks Search-R1's POST /retrieve.

The same calls against the real in-job actors, the Serve handle and HTTP: tests/test_serve.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raypipe.core.config import load_config
from raypipe.core.schema import FEATURES
from raypipe.retrieval.types import SearchHit, SearchResult
from raypipe.runtime.corpus_service import CorpusServiceError, ServiceCorpus
from raypipe.stages.features import FeatureStage, pack_trajectory, run_features
from raypipe.testing.synthetic import HashEncoder, synthetic_corpus, write_synthetic_run
from tests.helpers.search_r1_server import SearchR1Server


class FakeTransport:
    """A :class:`~raypipe.runtime.corpus_service.CorpusTransport` over the synthetic in-memory corpus,
    recording every call."""

    def __init__(self):
        self.corpus = synthetic_corpus()
        self.calls: list[tuple] = []

    def corpus_info(self):
        self.calls.append(("corpus_info",))
        return {"n_docs": self.corpus.num_docs, "dimension": 32}

    def doc_vectors(self, doc_ids):
        self.calls.append(("doc_vectors", len(doc_ids)))
        return self.corpus.doc_vectors(doc_ids)

    def document_frequencies(self, terms, lexicon):
        self.calls.append(("document_frequencies", tuple(terms), lexicon))
        return [self.corpus.document_frequency(t) + (1000 if lexicon == "terrier" else 0) for t in terms]

    def encode_queries(self, texts):
        self.calls.append(("encode_queries", len(texts)))
        return self.corpus.encode_queries(texts)

    def search(self, texts, k):
        self.calls.append(("search", len(texts), k))
        return [
            SearchResult(t, [SearchHit(d, 1.0, "", "") for d in ids])
            for t, ids in zip(texts, self.corpus.search(texts, k))
        ]

    def named(self, method):
        return [c for c in self.calls if c[0] == method]


def test_frequencies_are_fetched_once_per_lexicon_and_cached():
    transport = FakeTransport()
    corpus = ServiceCorpus(transport)
    assert corpus.num_docs == 500 and transport.calls == [("corpus_info",)]
    corpus.prefetch_terms(["river", "castle", "river", "zzz"])
    corpus.prefetch_terms(["castle", "king"], "terrier")
    assert transport.named("document_frequencies") == [
        ("document_frequencies", ("river", "castle", "zzz"), "plain"),
        ("document_frequencies", ("castle", "king"), "terrier"),
    ]
    plain = transport.corpus.document_frequency("castle")
    assert (
        corpus.document_frequency("castle") == plain and corpus.document_frequency("castle", "terrier") == plain + 1000
    )
    assert corpus.document_frequency("zzz") == 0
    corpus.prefetch_terms(["river", "zzz"])
    assert len(transport.named("document_frequencies")) == 2  # nothing new to fetch
    assert corpus.document_frequency("band") == transport.corpus.document_frequency("band")  # a miss: one call
    assert transport.named("document_frequencies")[-1] == ("document_frequencies", ("band",), "plain")


def test_vectors_and_searches_pass_through_in_one_call_each():
    transport = FakeTransport()
    corpus = ServiceCorpus(transport)
    assert corpus.doc_vectors([]).shape == (0, 32) and corpus.encode_queries([]).shape == (0, 32)
    assert not transport.named("doc_vectors") and not transport.named("encode_queries")
    vectors = corpus.doc_vectors(["doc3", "doc1"])
    assert vectors.dtype == np.float32 and np.array_equal(vectors, transport.corpus.doc_vectors(["doc3", "doc1"]))
    assert corpus.search(["river king", "castle"], 5) == transport.corpus.search(["river king", "castle"], 5)
    assert transport.named("search") == [("search", 2, 5)]


@pytest.mark.parametrize("nqc_idf, lexicon", [("seed", "terrier"), ("true", "plain")])
def test_a_batch_asks_for_its_frequencies_in_one_call(tmp_path, nqc_idf, lexicon):
    run = write_synthetic_run(tmp_path / "run", n_questions=4, parts=1)
    iterations = run.read("iterations")
    packed = pa.concat_tables(
        [pack_trajectory(iterations.filter(pa.compute.equal(iterations.column("qid"), f"syn-{i}"))) for i in range(4)]
    )
    transport = FakeTransport()
    settings = load_config("embedded").features.model_copy(update={"nqc_idf": nqc_idf})
    stage = FeatureStage({"syn-0": "a river?"}, lambda: ServiceCorpus(transport), HashEncoder, settings)
    out = stage(packed)
    assert out.schema.equals(FEATURES) and out.num_rows == iterations.num_rows
    calls = transport.named("document_frequencies")
    assert len(calls) == 1 and calls[0][2] == lexicon  # the whole batch's terms, in the extractor's lexicon
    assert [len(transport.named(m)) for m in ("doc_vectors", "encode_queries", "search")] == [1, 1, 1]


def test_a_plain_search_r1_server_is_refused_at_start(tmp_path):
    """Search-R1's API gives ranked lists only: the stage stops before any Ray work, saying what to do."""
    server = SearchR1Server()
    try:
        run = write_synthetic_run(tmp_path / "run", n_questions=2, parts=1)
        config = load_config("embedded", ["retrieval.backend=http", f"retrieval.http.url={server.url}"])
        with pytest.raises(CorpusServiceError) as refused:
            run_features(run, config, sentence_factory=HashEncoder)
    finally:
        server.stop()
    message = str(refused.value)
    assert f"{server.url} has no GET /raypipe/corpus_info (HTTP 404)" in message
    assert "passage vectors and document frequencies" in message
    assert "raypipe serve-retrieval" in message and "retrieval.backend=actors" in message
    assert not run.table_dir("features").exists()
