"""The trajectory extractor: signals wired to the right iterations, nulls where undefined, grouping."""

import math
import random
from collections import defaultdict

import numpy as np
import pytest

from raypipe.core.config import FeaturesConfig
from raypipe.core.schema import FEATURE_COLUMNS, RBO_COLUMNS, conform
from raypipe.features import overlap, qpp
from raypipe.features.extract import TrajectoryError, extract_many, extract_trajectory
from raypipe.features.resources import InMemoryCorpus


class DictEncoder:
    """Maps known texts to fixed vectors; an unexpected text is an error (nothing is encoded by accident)."""

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        return np.array([self.table[t] for t in texts], dtype=float)


SENTENCES = {
    "Who wrote Hamlet?": [1.0, 0.0],
    "hamlet author": [1.0, 1.0],
    "shakespeare birthplace": [0.0, 1.0],
    "hamlet": [0.5, 0.5],
    "hamlet play": [0.5, 0.5],
    "Hamlet play": [0.5, 0.5],
    "playing": [0.5, 0.5],
    "the hamlet": [0.5, 0.5],
    "r0": [1.0, 0.0],
    "r1": [0.0, 1.0],
    "r2": [1.0, 1.0],
    "r3": [-1.0, 0.0],
}
DOCS = {  # id -> (vector, text)
    "a": ([1.0, 0.0], "hamlet play"),
    "b": ([0.0, 1.0], "hamlet prince"),
    "c": ([1.0, 1.0], "the stratford town"),
    "d": ([-1.0, 0.5], "macbeth play"),
}
QUERY_VECTORS = {
    "Who wrote Hamlet?": [1.0, 0.2],
    "hamlet author": [0.5, 0.5],
    "shakespeare birthplace": [0.0, 1.0],
    "hamlet": [0.5, 0.5],
    "hamlet play": [0.5, 0.5],
    "Hamlet play": [0.5, 0.5],
    "playing": [0.5, 0.5],
    "the hamlet": [0.5, 0.5],
}


@pytest.fixture
def corpus():
    return InMemoryCorpus(
        {k: np.array(v) for k, (v, _) in DOCS.items()},
        {k: t for k, (_, t) in DOCS.items()},
        lambda texts: np.array([QUERY_VECTORS[t] for t in texts]),
    )


def row(i, query, ids, scores, reasoning, logprobs, f1=0.0, utility=None, qid="q1"):
    return {
        "qid": qid,
        "dataset": "hotpotqa",
        "iteration": i,
        "query": query,
        "doc_ids": ids,
        "doc_scores": scores,
        "reasoning": reasoning,
        "probe_answer": "x",
        "probe_token_logprobs": logprobs,
        "probe_f1": f1,
        "utility": utility,
        "tokens_generated": 10,
        "probe_tokens": len(logprobs or []),
    }


def trajectory():
    return [
        row(0, None, [], [], "r0", [-1.0, -1.0, -1.0, -1.0, -1.0, -3.0]),
        row(
            1,
            "hamlet author",
            ["a", "b", "c"],
            [3.0, 2.0, 1.0],
            "<think> r1 </think>\n<search>",
            [-0.5] * 6,
            f1=0.5,
            utility=0.5,
        ),
        row(2, "shakespeare birthplace", ["c", "d", "b"], [2.0, 1.5, 0.5], "r2", [-0.2] * 7, f1=1.0, utility=0.5),
        row(3, "", [], [], "r3", [-0.1, -0.1], f1=1.0, utility=0.0),  # empty query: no retrieval
    ]


def extract(corpus, rows=None, question="Who wrote Hamlet?", **settings):
    encoder = DictEncoder(SENTENCES)
    return extract_trajectory(rows or trajectory(), question, corpus, encoder, FeaturesConfig(**settings))


def test_rows_conform_to_the_schema_in_iteration_order(corpus):
    out = extract(corpus)
    table = conform(out, "features")
    assert table.column("iteration").to_pylist() == [0, 1, 2, 3]
    assert table.column("probe_f1").to_pylist() == [0.0, 0.5, 1.0, 1.0]
    assert table.column("utility").to_pylist() == [None, 0.5, 0.5, 0.0]


def test_iteration_zero_is_null_except_its_probe(corpus):
    first = extract(corpus)[0]
    defined = {name for name in FEATURE_COLUMNS if first[name] is not None}
    assert defined == {"probe_conf", "probe_conf_full"}
    assert first["probe_conf"] == pytest.approx(-1.0)  # last 4 dropped
    assert first["probe_conf_full"] == pytest.approx(-8 / 6)


def test_qpp_of_the_first_retrieval(corpus):
    one = extract(corpus)[1]
    # "hamlet author": df(hamlet) = 2, df(author) = 0 -> counts as 1: max idf = log(4 / 1)
    assert one["nqc_seed"] == pytest.approx(np.var([3.0, 2.0, 1.0]) * math.log(4))
    assert one["nqc_shtok"] == pytest.approx(np.std([3.0, 2.0, 1.0]) / 2.0)
    vectors = np.array([DOCS[d][0] for d in "abc"])
    assert one["a_pair_ratio"] == pytest.approx(qpp.a_pair_ratio(vectors, [3.0, 2.0, 1.0]))
    # query (0.5, 0.5) and docs a, b, c: extents (1, 1) -> 0
    assert one["dense_qpp"] == pytest.approx(0.0)


def test_rbo_against_previous_lists_and_the_question(corpus):
    out = extract(corpus)
    one, two = out[1], out[2]
    assert one["rbo_prev_3"] == 0.0 and one["rbo_prevmax_20"] == 0.0  # iteration 0 has no list: the seed's 0.0
    # The question "Who wrote Hamlet?" (1, 0.2) ranks a (1.0), c (1.2), b (0.2), d (-0.9): c, a, b, d.
    question_list = ["c", "a", "b", "d"]
    assert one["rbo_question_3"] == pytest.approx(overlap.rbo_truncated(["a", "b", "c"], question_list, 3))
    assert one["rbo_ext_question_20"] == pytest.approx(overlap.rbo_extrapolated(["a", "b", "c"], question_list, 20))
    # Iteration 2 vs iteration 1: [c, d, b] vs [a, b, c]: X = 0, 0, 2.
    expected = overlap.rbo_truncated(["c", "d", "b"], ["a", "b", "c"], 3)
    weights = [0.99**i for i in range(1000)]
    tail = sum(w * 2 / (i + 1) for i, w in enumerate(weights) if i >= 3)
    assert expected == pytest.approx((weights[2] * 2 / 3 + tail) / sum(weights))
    assert two["rbo_prev_3"] == pytest.approx(expected)
    assert two["rbo_prevmax_3"] == pytest.approx(expected)
    assert two["rbo_ext_prev_3"] == pytest.approx(overlap.rbo_extrapolated(["c", "d", "b"], ["a", "b", "c"], 3))


def test_empty_retrieval_iteration_has_no_qpp_and_zero_rbo(corpus):
    three = extract(corpus)[3]
    for name in ("nqc_seed", "nqc_shtok", "a_pair_ratio", "dense_qpp", "sim_question_query"):
        assert three[name] is None, name
    assert all(three[name] == 0.0 for name in RBO_COLUMNS)  # an empty list: the seed's 0.0
    undefined = extract(corpus, rbo_missing="undefined")[3]
    assert all(undefined[name] is None for name in RBO_COLUMNS)
    assert three["sim_reasoning_prev"] == pytest.approx(-1 / math.sqrt(2))  # r2 (1,1) vs r3 (-1,0)


def test_rbo_of_a_missing_list_and_the_first_prevmax_are_the_seeds_zero(corpus):
    """DanielTian97/agentic_rag_predictions ``predictions/unsupervised/retrieval_similarity.py``: ``_rbo``
    returns 0.0 when either list is empty (lines 40-51) and ``compute_inter_iteration_rbo`` gives the first
    retrieval iteration 0.0 (``max(similarities) if similarities else 0.0``, lines 54-82)."""
    one = extract(corpus)[1]
    names = [f"{v}_{kind}_{d}" for v in ("rbo", "rbo_ext") for kind in ("prev", "prevmax") for d in (3, 20)]
    assert all(one[name] == 0.0 for name in names)
    assert one["rbo_question_3"] > 0.0  # the question's own list is there
    undefined = extract(corpus, rbo_missing="undefined")[1]
    assert undefined["rbo_prevmax_3"] is None and undefined["rbo_ext_prev_20"] is None
    assert all(extract(corpus)[0][name] is None for name in RBO_COLUMNS)  # iteration 0 retrieves nothing


@pytest.mark.parametrize(
    "query, seed_idf, true_idf",
    [
        ("hamlet play", math.log(4 / 2), math.log(4 / 2)),  # "play" stems to "plai", in the Terrier lexicon
        ("playing", math.log(4 / 2), math.log(4)),  # its stem "plai" is found; the plain token is not
        ("Hamlet play", math.log(4), math.log(4 / 2)),  # "Hamlet" is not lowercased: not found, df = 1
        ("the hamlet", math.log(4), math.log(4)),  # a stopword is not in the Terrier lexicon: df = 1
        ("hamlet", math.log(4 / 2), math.log(4 / 2)),  # found as it is
    ],
)
def test_nqc_max_idf_is_the_seeds_lookup(corpus, query, seed_idf, true_idf):
    """DanielTian97/agentic_rag_predictions ``predictions/unsupervised/qpp/calculator.py``
    ``QPPCalculator._max_idf`` (lines 37-58): ``str(query).split()``, Porter stem without lowercasing,
    lookup in the Terrier lexicon (lowercase Porter stems, no stopwords), a term not found counts as
    df = 1, so the max IDF is about log N for most queries. ``features.nqc_idf="true"`` looks the
    statistics' own tokens up in the plain lexicon instead."""
    rows = [trajectory()[0], row(1, query, ["a", "b", "c"], [3.0, 2.0, 1.0], "r1", [-0.5] * 6)]
    variance = np.var([3.0, 2.0, 1.0])
    assert extract(corpus, rows)[1]["nqc_seed"] == pytest.approx(variance * seed_idf)
    assert extract(corpus, rows, nqc_idf="true")[1]["nqc_seed"] == pytest.approx(variance * true_idf)
    assert qpp.seed_query_terms("Hamlet play? plays") == ["Hamlet", "play?", "plai"]
    assert (corpus.document_frequency("the", "terrier"), corpus.document_frequency("the")) == (0, 1)


def test_reasoning_text_setting_reaches_the_similarities(corpus):
    rows = trajectory()
    turn = "<think> r1 </think>\n<search> shakespeare birthplace </search>"
    rows[2] = dict(rows[2], reasoning=turn)
    # parsed (default): r_2 is "r1", so it equals r_1 (the DictEncoder refuses any text it does not know)
    assert extract(corpus, rows)[2]["sim_reasoning_prev"] == pytest.approx(1.0)
    encoder = DictEncoder({**SENTENCES, turn: [-1.0, 0.0], "<think> r1 </think>\n<search>": [0.0, 1.0]})
    raw = extract_trajectory(rows, "Who wrote Hamlet?", corpus, encoder, FeaturesConfig(reasoning_text="raw"))[2]
    assert raw["sim_reasoning_prev"] == pytest.approx(0.0)  # the whole turns (0, 1) vs (-1, 0)


def test_prevmax_takes_the_best_earlier_list(corpus):
    rows = trajectory()[:3] + [row(3, "hamlet author", ["a", "b", "c"], [3.0, 2.0, 1.0], "r3", [-0.1] * 5)]
    three = extract(corpus, rows)[3]
    assert three["rbo_prevmax_3"] == pytest.approx(overlap.rbo_truncated(["a", "b", "c"], ["a", "b", "c"], 3))
    assert three["rbo_prev_3"] == pytest.approx(overlap.rbo_truncated(["a", "b", "c"], ["c", "d", "b"], 3))
    assert three["rbo_ext_prevmax_20"] == pytest.approx(1.0)


def test_sentence_similarities(corpus):
    out = extract(corpus)
    # question (1,0) vs "hamlet author" (1,1); vs "shakespeare birthplace" (0,1)
    assert out[1]["sim_question_query"] == pytest.approx(1 / math.sqrt(2))
    assert out[2]["sim_question_query"] == pytest.approx(0.0)
    assert out[1]["sim_reasoning_prev"] == pytest.approx(0.0)  # r0 (1,0) vs r1 (0,1)
    assert out[2]["sim_reasoning_prev"] == pytest.approx(1 / math.sqrt(2))  # r1 vs r2 (1,1)
    assert out[2]["sim_reasoning_first"] == pytest.approx(1 / math.sqrt(2))  # r0 vs r2
    assert out[3]["sim_reasoning_first"] == pytest.approx(-1.0)  # r0 vs r3 (-1,0)


def test_probe_confidence_and_its_change(corpus):
    out = extract(corpus)
    assert out[1]["probe_conf"] == pytest.approx(-0.5)
    assert out[1]["probe_conf_delta"] == pytest.approx(0.5)  # -0.5 - (-1.0)
    assert out[1]["probe_conf_full_delta"] == pytest.approx(-0.5 + 8 / 6)
    assert out[2]["probe_conf_delta"] == pytest.approx(0.3)
    assert out[3]["probe_conf"] is None  # 2 tokens, 4 dropped
    assert out[3]["probe_conf_delta"] is None
    assert out[3]["probe_conf_full_delta"] == pytest.approx(0.1)


def test_missing_question_gives_null_question_signals(corpus):
    out = extract(corpus, question=None)
    assert all(r["sim_question_query"] is None and r["rbo_question_3"] is None for r in out)
    assert out[2]["rbo_prev_3"] is not None


def test_missing_texts_and_logprobs_are_null(corpus):
    rows = trajectory()
    rows[1]["reasoning"] = None
    rows[1]["probe_token_logprobs"] = None
    out = extract(corpus, rows)
    assert out[1]["sim_reasoning_prev"] is None and out[2]["sim_reasoning_prev"] is None
    assert out[1]["probe_conf_full"] is None and out[2]["probe_conf_full_delta"] is None


def test_row_order_does_not_matter(corpus):
    rows = trajectory()
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    assert extract(corpus, shuffled) == extract(corpus, rows)


def test_a_gap_in_the_iterations_leaves_no_previous(corpus):
    rows = [r for r in trajectory() if r["iteration"] != 1]
    out = extract(corpus, rows, rbo_missing="undefined")
    assert [r["iteration"] for r in out] == [0, 2, 3]
    assert out[1]["rbo_prev_3"] is None and out[1]["sim_reasoning_prev"] is None
    assert out[1]["probe_conf_delta"] is None
    assert out[1]["rbo_question_3"] is not None


def test_only_a_probe_zero(corpus):
    out = extract(corpus, [trajectory()[0]])
    assert len(out) == 1 and out[0]["rbo_question_3"] is None


def test_bad_trajectories_are_refused(corpus):
    rows = trajectory()
    with pytest.raises(TrajectoryError, match="several trajectories"):
        extract(corpus, rows + [row(0, None, [], [], "r0", [], qid="q2")])
    with pytest.raises(TrajectoryError, match="duplicate iterations"):
        extract(corpus, rows + [rows[1]])
    bad = trajectory()
    bad[1]["doc_scores"] = [1.0]
    with pytest.raises(TrajectoryError, match="3 doc_ids but 1 doc_scores"):
        extract(corpus, bad)


def test_each_encoder_is_called_once_per_trajectory(corpus):
    encoder = DictEncoder(SENTENCES)
    extract_trajectory(trajectory(), "Who wrote Hamlet?", corpus, encoder)
    assert encoder.calls == 1


class CountingCorpus:
    def __init__(self, corpus):
        self.corpus, self.num_docs, self.calls = corpus, corpus.num_docs, defaultdict(int)

    def __getattr__(self, name):
        fn = getattr(self.corpus, name)

        def counted(*args):
            self.calls[name] += 1
            return fn(*args)

        return counted


def test_extract_many_batches_the_calls_and_matches_one_by_one(corpus):
    second = [dict(r, qid="q2") for r in trajectory()[:3]]
    second[2] = dict(second[2], reasoning="r1", doc_ids=["d", "a", "b"])
    pairs = [(trajectory(), "Who wrote Hamlet?"), (second, "hamlet author"), ([trajectory()[0]], None)]
    encoder, counting = DictEncoder(SENTENCES), CountingCorpus(corpus)
    batched = extract_many(pairs, counting, encoder)
    assert encoder.calls == 1
    assert {k: counting.calls[k] for k in ("doc_vectors", "encode_queries", "search")} == {
        "doc_vectors": 1,
        "encode_queries": 1,
        "search": 1,
    }
    one_by_one = [extract_trajectory(rows, q, corpus, DictEncoder(SENTENCES)) for rows, q in pairs]
    assert batched == one_by_one
    assert batched[1][2]["rbo_prev_3"] == pytest.approx(overlap.rbo_truncated(["d", "a", "b"], ["a", "b", "c"], 3))


def test_signal_settings_default_to_the_seed_papers():
    cfg = FeaturesConfig()
    seed = {
        "rbo_p": 0.99,
        "nqc_depth": 100,
        "nqc_k": 100,
        "a_pair_depth": 50,
        "dense_qpp_k": 3,
        "confidence_drop_last": 4,
    }
    assert cfg.model_dump(include=set(seed)) == seed
    assert (qpp.SEED.nqc_depth, qpp.SEED.nqc_k, qpp.SEED.a_pair_depth, qpp.SEED.dense_qpp_k) == (100, 100, 50, 3)
    assert overlap.SEED_P == 0.99
