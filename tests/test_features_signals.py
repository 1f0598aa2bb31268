"""Every signal pinned on small hand-computed inputs (raypipe.features: overlap, qpp, confidence, similarity)."""

import math

import numpy as np
import pytest

from raypipe.features import confidence, overlap, qpp
from raypipe.features.similarity import cosine

# ---- RBO, PyTerrier-alpha's truncated form ---------------------------------------------------------


@pytest.mark.parametrize("depth,expected", [(3, 0.114605), (20, 0.424191)])
def test_rbo_truncated_identical_lists_pinned(depth, expected):
    ids = [f"d{i}" for i in range(100)]
    assert overlap.rbo_truncated(ids, list(ids), depth) == pytest.approx(expected, abs=1e-6)


def test_rbo_truncated_cuts_at_depth():
    # Lists agree on the top 3 only: at depth 3 they are "identical".
    assert overlap.rbo_truncated(["a", "b", "c", "x"], ["a", "b", "c", "y"], 3) == pytest.approx(0.114605, abs=1e-6)


def test_rbo_truncated_swapped_pair_closed_form():
    # X_1 = 0, X_d = 2 for d >= 2; p = 0.5: sum_{d>=2} 0.5^(d-1) * 2/d / sum 0.5^(d-1) = 2 ln 2 - 1.
    assert overlap.rbo_truncated(["a", "b"], ["b", "a"], 2, p=0.5) == pytest.approx(2 * math.log(2) - 1, abs=1e-9)


def test_rbo_truncated_disjoint_and_empty():
    assert overlap.rbo_truncated(["a", "b", "c"], ["x", "y", "z"], 3) == 0.0
    assert overlap.rbo_truncated([], ["x"], 3) is None
    assert overlap.rbo_truncated(["a"], [], 20) is None


def test_rbo_truncated_repeated_id_counts_once():
    # PyTerrier-alpha keeps sets: ["a", "a"] vs ["a", "b"] overlaps in one id at every depth.
    p = 0.5
    expected_score = sum(p ** (d - 1) * 1 / d for d in range(1, 1001))
    expected = expected_score / sum(p ** (d - 1) for d in range(1, 1001))
    assert overlap.rbo_truncated(["a", "a"], ["a", "b"], 2, p=p) == pytest.approx(expected)


# ---- RBO, Webber's extrapolated form ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [3, 20])
def test_rbo_extrapolated_identical_is_one(depth):
    ids = [f"d{i}" for i in range(30)]
    assert overlap.rbo_extrapolated(ids, list(ids), depth) == pytest.approx(1.0)


def test_rbo_extrapolated_hand_computed():
    # X = 1, 1, 3; A_d = 1, 1/2, 1; p = 0.9:
    # (1-p)/p * (0.9*1 + 0.81*0.5 + 0.729*1) + 1 * 0.729 = 2.034/9 + 0.729
    assert overlap.rbo_extrapolated(["a", "b", "c"], ["a", "c", "b"], 3, p=0.9) == pytest.approx(2.034 / 9 + 0.729)


def test_rbo_extrapolated_uneven_lists():
    # S = [b], L = [a, b], p = 0.5: s = 1, l = 2, X_1 = 0, X_2 = 1.
    # (1-p)/p * (X_2/2 * p^2 + X_s*(2-1)/(1*2) * p^2) + ((X_2 - X_s)/2 + X_s/1) * p^2 = 0.125 + 0.125
    assert overlap.rbo_extrapolated(["b"], ["a", "b"], 20, p=0.5) == pytest.approx(0.25)
    assert overlap.rbo_extrapolated(["a", "b"], ["b"], 20, p=0.5) == pytest.approx(0.25)  # symmetric


def test_rbo_extrapolated_disjoint_and_empty():
    assert overlap.rbo_extrapolated(["a", "b"], ["x", "y"], 3) == pytest.approx(0.0)
    assert overlap.rbo_extrapolated([], ["x"], 3) is None


@pytest.mark.parametrize("fn", [overlap.rbo_truncated, overlap.rbo_extrapolated])
def test_rbo_rejects_bad_parameters(fn):
    with pytest.raises(ValueError, match="depth"):
        fn(["a"], ["a"], 0)
    with pytest.raises(ValueError, match="persistence"):
        fn(["a"], ["a"], 3, p=1.0)


# ---- QPP ---------------------------------------------------------------------------------------


def test_max_idf_follows_the_seed_conventions():
    assert qpp.max_idf([10, 50], 100) == pytest.approx(math.log(10))
    assert qpp.max_idf([50, None], 100) == pytest.approx(math.log(100))  # unknown term counts as df = 1
    assert qpp.max_idf([0], 100) == pytest.approx(math.log(100))
    assert qpp.max_idf([], 100) == pytest.approx(math.log(100))  # no terms: log N


def test_nqc_seed_is_population_variance_times_idf():
    assert qpp.nqc_seed([3.0, 1.0], 2.0) == pytest.approx(2.0)  # var = 1
    assert qpp.nqc_seed([3.0, 1.0, 100.0], 2.0, depth=2) == pytest.approx(2.0)  # only the top `depth`
    assert qpp.nqc_seed([], 2.0) is None


def test_nqc_shtok_std_over_corpus_score():
    assert qpp.nqc_shtok([3.0, 1.0], k=2) == pytest.approx(0.5)  # std 1 / mean 2
    assert qpp.nqc_shtok([3.0, 1.0, 2.0], k=2) == pytest.approx(0.5)  # std of top 2 = 1, mean of all = 2
    assert qpp.nqc_shtok([3.0, 1.0], k=2, corpus_score=-4.0) == pytest.approx(0.25)
    assert qpp.nqc_shtok([1.0, -1.0], k=2) is None  # zero corpus score
    assert qpp.nqc_shtok([], k=2) is None


def test_a_pair_ratio_two_orthogonal_docs():
    # S = I, s = (2, 1): W = s s^T = [[4, 2], [2, 1]]; top block (1x1) = 4; tail from row int(0.4)=0: mean 9/4.
    assert qpp.a_pair_ratio(np.eye(2), [2.0, 1.0]) == pytest.approx(4 / 2.25)


def test_a_pair_ratio_is_a_matrix_product_and_uses_the_tail_from_20_percent():
    # Identical vectors: S = 1, W[i, j] = (sum s) * s_j. n = 10: top block 1x1 (= sum s * s_0), tail from 2.
    scores = [10.0, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    vectors = np.ones((10, 4))
    assert qpp.a_pair_ratio(vectors, scores) == pytest.approx(10 / np.mean(scores[2:]))


def test_a_pair_ratio_depth_and_undefined():
    scores = [10.0, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    # depth 5: top block 1x1, tail from int(1.0) = 1: s_0 / mean(s_1..s_4)
    assert qpp.a_pair_ratio(np.ones((10, 3)), scores, depth=5) == pytest.approx(10 / np.mean(scores[1:5]))
    assert qpp.a_pair_ratio(np.ones((2, 3)), [0.0, 0.0]) is None
    assert qpp.a_pair_ratio(np.ones((0, 3)), []) is None


def test_dense_qpp_extent_per_dimension():
    query = np.array([0.0, 0.0])
    docs = np.array([[1.0, 2.0], [0.5, -2.0], [9.0, 9.0]])
    # top 2: extents (1, 4) -> -(log 1 + log 4)
    assert qpp.dense_qpp(query, docs, k=2) == pytest.approx(-math.log(4))
    # top 3: extents (9, 11)
    assert qpp.dense_qpp(query, docs) == pytest.approx(-math.log(9) - math.log(11))
    assert qpp.dense_qpp(query, np.zeros((0, 2))) is None


def test_dense_qpp_clamps_zero_extent():
    value = qpp.dense_qpp(np.ones(2), np.ones((3, 2)))
    assert value == pytest.approx(-2 * math.log(np.finfo(float).tiny))
    assert math.isfinite(value)


# ---- Confidence and similarity -------------------------------------------------------------------


def test_probe_confidence_drops_the_tail():
    logprobs = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    assert confidence.mean_logprob(logprobs, drop_last=4) == pytest.approx(-1.5)
    assert confidence.mean_logprob(logprobs) == pytest.approx(-3.5)


def test_probe_confidence_missing_is_none():
    assert confidence.mean_logprob([-1.0, -2.0, -3.0, -4.0], drop_last=4) is None  # nothing left
    assert confidence.mean_logprob([], drop_last=0) is None
    assert confidence.mean_logprob(None) is None
    with pytest.raises(ValueError, match="drop_last"):
        confidence.mean_logprob([-1.0], drop_last=-1)


def test_delta():
    assert confidence.delta(-1.0, -3.0) == pytest.approx(2.0)
    assert confidence.delta(None, -3.0) is None
    assert confidence.delta(-1.0, None) is None


def test_cosine():
    assert cosine(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert cosine(np.array([1.0, 0.0]), np.array([-2.0, 0.0])) == pytest.approx(-1.0)
    assert cosine(np.zeros(2), np.ones(2)) is None
    assert cosine(None, np.ones(2)) is None


@pytest.mark.parametrize(
    "text,expected",
    [
        # Search-R1 turns: the last complete think block; no block, no reasoning
        ("<think> first </think>\n<search> q </search>", "first"),
        ("<think>a</think> x <think> last one </think><answer> y </answer>", "last one"),
        ("<think> unfinished thought", None),
        ("<think> unfinished <search> q </search>", None),
        ("no think tags <search> q </search>", None),
        ("<think>  </think>", None),
        # R1-Searcher turns (the prompt opened <think>): the text before the query span / before </think>
        (" I need the author. <|begin_of_query|> Hamlet\tauthor <|end_of_query|>", "I need the author."),
        (" It is Shakespeare. </think>\n\n<answer> William Shakespeare </answer>", "It is Shakespeare."),
        ("<|begin_of_query|> q <|end_of_query|>", None),
        ("<answer> Paris </answer>", None),  # a bare answer has no reasoning
        ("plain text", "plain text"),
        (None, None),
    ],
)
def test_reasoning_text_is_the_parsed_think_text(text, expected):
    """r_i is the seed's parsed reasoning: DanielTian97/agentic_rag_predictions
    ``predictions/unsupervised/semantic_similarity.py`` ``_extract_search_r1_reasoning`` (lines 95-131: the
    last ``<think>(.*?)</think>`` of a turn, else "") and ``_extract_r1_searcher_reasoning`` (lines 134-154:
    the text before ``</think>``, split at the query spans); no search action, query markup or answer."""
    from raypipe.features.similarity import reasoning_text

    assert reasoning_text(text) == expected


def test_raw_reasoning_text_is_the_whole_turn():
    from raypipe.features.similarity import reasoning_text

    turn = "<think> r </think>\n<search> q </search>"
    assert reasoning_text(turn, "raw") == turn and reasoning_text("  ", "raw") is None
