"""The features stage's adapter over a real (tiny) retrieval index directory, and the extractor on it."""

import json

import numpy as np
import pytest

from raypipe.config import load_config
from raypipe.features.extract import extract_trajectory
from raypipe.stages.features import IndexCorpus, SbertEncoder

PASSAGES = [
    ("p1", "Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("p2", "William Shakespeare", "Shakespeare was an English playwright born in Stratford-upon-Avon."),
    ("p3", "Stratford-upon-Avon", "Stratford-upon-Avon is a market town in Warwickshire, England."),
    ("p4", "Macbeth", "Macbeth is a tragedy by William Shakespeare about a Scottish general."),
    ("p5", "Thames", "The Thames is a river that flows through London."),
    ("p6", "Paris", "Paris is the capital of France."),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from raypipe.retrieval import ensure_index

    root = tmp_path_factory.mktemp("index")
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in PASSAGES))
    config = load_config("embedded", [f"data.corpus={path}", f"retrieval.index_dir={root / 'idx'}"])
    ensure_index(config, use_ray=False)
    return IndexCorpus.open(config)


@pytest.mark.slow
def test_index_adapter_reads_the_index(corpus):
    from raypipe.retrieval.encoders import passage_text

    assert corpus.num_docs == 6
    assert corpus.terms("Who wrote HAMLET?") == ["who", "wrote", "hamlet"]
    assert corpus.document_frequency("shakespeare") == 3 and corpus.document_frequency("zzz") == 0
    vectors = corpus.doc_vectors(["p2", "p1"])
    encoded = corpus.retriever.encoder.encode_passages([passage_text(*PASSAGES[1][1:]), passage_text(*PASSAGES[0][1:])])
    assert np.allclose(vectors, encoded, atol=1e-5)  # reconstructed from the flat index
    assert corpus.search(["capital of France"], 2)[0][0] == "p6"
    assert corpus.encode_queries(["a", "b"]).shape == (2, vectors.shape[1])


@pytest.mark.slow
def test_extractor_end_to_end_on_a_real_index(corpus):
    hits = corpus.retriever.search_batch(["Hamlet author", "Shakespeare birthplace"], 6)
    rows = [
        {"qid": "q", "dataset": "d", "iteration": 0, "query": None, "doc_ids": [], "doc_scores": [],
         "reasoning": "I need to find who wrote Hamlet.", "probe_token_logprobs": [-0.1] * 6,
         "probe_f1": 0.0, "utility": None},
    ] + [
        {"qid": "q", "dataset": "d", "iteration": i + 1, "query": r.query, "doc_ids": [h.doc_id for h in r.hits],
         "doc_scores": [h.score for h in r.hits], "reasoning": f"Step {i + 1}: the documents mention Shakespeare.",
         "probe_token_logprobs": [-0.2] * 6, "probe_f1": 1.0, "utility": 1.0 if i == 0 else 0.0}
        for i, r in enumerate(hits)
    ]  # fmt: skip
    out = extract_trajectory(rows, "Who wrote Hamlet?", corpus, SbertEncoder("minilm"))
    second = out[2]
    for name in ("nqc_seed", "nqc_shtok", "a_pair_ratio", "dense_qpp", "rbo_prev_3", "rbo_question_20",
                 "sim_question_query", "sim_reasoning_prev", "sim_reasoning_first"):  # fmt: skip
        assert second[name] is not None and np.isfinite(second[name]), name
    assert out[1]["sim_question_query"] > out[2]["sim_question_query"]  # "Hamlet author" is closer
    # "hamlet author": author is unknown (df counts as 1) -> max IDF = log 6
    assert out[1]["nqc_seed"] == pytest.approx(np.var(rows[1]["doc_scores"]) * np.log(6), rel=1e-5)
