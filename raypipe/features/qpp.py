"""Query performance prediction over one iteration's ranked list (pure functions of scores and vectors).

Lists are taken in the order given (best first, as the retriever returns them). Every function returns
``None`` when its input list is empty or the value is undefined (a zero denominator), never a made-up 0.

- :func:`nqc_seed`: the seed paper's "NQC" (``predictions/unsupervised/qpp/calculator.py``): the
  population variance of the top-100 scores times the query's maximum IDF, ``max_t log(N / df_t)``; a
  query term the corpus statistics do not know counts as ``df = 1`` and a query with no terms gets
  ``log N``, as there. :func:`seed_query_terms` gives the terms as the seed looks them up (in the
  Terrier lexicon).
- :func:`nqc_shtok`: textbook NQC (Shtok et al., TOIS 2012): the standard deviation of the top-k scores
  divided by the absolute corpus score. A dense index has no corpus-as-one-document score, so the
  surrogate used here is explicit: the mean score of the whole deep list given (e.g. the top 100).
- :func:`a_pair_ratio`: the seed's pairwise document coherence over the top 50: with ``S`` the cosine
  similarity matrix of the documents' vectors and ``s`` their scores, ``W = S @ (s s^T)``; the ratio of
  the mean of ``W``'s top-left ``ceil(0.1 n)`` block to the mean of its block from row/column
  ``int(0.2 n)`` on (``n`` = the depth used).
- :func:`dense_qpp`: the seed's dense QPP / semantic concentration over the top 3: the per-dimension
  extent (max - min) of the query vector and the documents' vectors, ``-Σ log(extent)`` (extents
  clamped at the smallest positive float, as there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from raypipe.core.config import FeaturesConfig
from raypipe.retrieval import porter

SEED = FeaturesConfig()  # the features section's defaults are the seed paper's depths


def seed_query_terms(query: str) -> list[str]:
    """The keys the seed looks a query's terms up by in its Terrier lexicon (raypipe's ``terrier`` lexicon).

    ``predictions/unsupervised/qpp/calculator.py`` ``QPPCalculator._max_idf`` (lines 37-58):
    whitespace split, Terrier's Porter stemmer on each token, no lowercasing and no punctuation
    stripping. The lexicon holds Porter stems of lowercase tokens without stopwords
    (:mod:`raypipe.retrieval.terrier`), so a capitalised or punctuated token, or a stopword, is not
    found and counts as ``df = 1`` (:func:`max_idf`): for most queries the max IDF is about ``log N``.
    """
    return [porter.stem(token) for token in query.split()]


def max_idf(dfs: Iterable[int | None], num_docs: int) -> float:
    """``max_t log(N / df_t)`` over a query's terms (``df`` unknown or 0 counts as 1; no terms: log N)."""
    if num_docs < 1:
        raise ValueError(f"num_docs must be >= 1, got {num_docs}")
    values = [max(int(df or 0), 1) for df in dfs]
    if not values:
        return math.log(num_docs)
    return max(math.log(num_docs / df) for df in values)


def nqc_seed(scores: Sequence[float], query_max_idf: float, depth: int = SEED.nqc_depth) -> float | None:
    """The seed paper's "NQC": ``var(top-depth scores) * max IDF``."""
    top = np.asarray(scores, dtype=float)[:depth]
    if top.size == 0:
        return None
    return float(np.var(top) * query_max_idf)


def nqc_shtok(scores: Sequence[float], k: int = SEED.nqc_k, corpus_score: float | None = None) -> float | None:
    """Textbook NQC: ``std(top-k scores) / |corpus score|``; the corpus score defaults to the mean of ``scores``."""
    all_scores = np.asarray(scores, dtype=float)
    if all_scores.size == 0:
        return None
    reference = float(all_scores.mean()) if corpus_score is None else float(corpus_score)
    if reference == 0.0:
        return None
    return float(np.std(all_scores[:k]) / abs(reference))


def a_pair_ratio(doc_vectors: np.ndarray, scores: Sequence[float], depth: int = SEED.a_pair_depth) -> float | None:
    """The seed's pairwise document coherence ratio over the top ``depth`` documents."""
    n = min(depth, len(scores))
    if n == 0:
        return None
    vectors = np.asarray(doc_vectors, dtype=float)[:n]
    if vectors.shape[0] != n:
        raise ValueError(f"a_pair_ratio: {vectors.shape[0]} vectors for {n} scores")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    s = np.asarray(scores, dtype=float)[:n, None]
    weighted = (unit @ unit.T) @ (s @ s.T)
    top_n = max(1, math.ceil(0.1 * n))
    tail_start = int(0.2 * n)
    tail_mean = float(np.mean(weighted[tail_start:, tail_start:]))
    if tail_mean == 0.0:
        return None
    return float(np.mean(weighted[:top_n, :top_n]) / tail_mean)


def dense_qpp(query_vector: np.ndarray, doc_vectors: np.ndarray, k: int = SEED.dense_qpp_k) -> float | None:
    """The seed's semantic concentration: ``-Σ_dim log(max - min)`` over the query and top-k document vectors."""
    docs = np.asarray(doc_vectors, dtype=float)[:k]
    if docs.shape[0] == 0:
        return None
    points = np.vstack([np.asarray(query_vector, dtype=float)[None, :], docs])
    extent = np.maximum(points.max(axis=0) - points.min(axis=0), np.finfo(float).tiny)
    return float(-np.sum(np.log(extent)))
