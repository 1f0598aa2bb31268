"""Turn one trajectory's iteration rows into feature rows (the pure core of the features stage).

A trajectory is processed as a whole because the inter-iteration signals look backwards: iteration i
needs the lists, reasoning and probes of iterations < i. :func:`extract_trajectory` calls each encoder
and the index once per trajectory; :func:`extract_many` does a batch of trajectories with one call per
kind for the whole batch (bigger encoder batches, one index search for all the questions). The
signals' depths and constants are the ``features`` section of the run config (defaults: the seed paper's).

RBO at a retrieval iteration, with ``features.rbo_missing="zero"`` (the default), is 0.0 against an
empty or missing list and the max over previous lists is 0.0 when there is none (the first retrieval
iteration), as the seed computes them (``predictions/unsupervised/retrieval_similarity.py``: ``_rbo``
lines 40-51, ``compute_inter_iteration_rbo`` lines 54-82); ``"undefined"`` leaves them null. Iteration
0 retrieves nothing and has no RBO either way (the seed has no row for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raypipe.core.config import FeaturesConfig
from raypipe.core.schema import RBO_DEPTHS
from raypipe.features import confidence, overlap, qpp
from raypipe.features.resources import CorpusResources, SentenceEncoder
from raypipe.features.similarity import cosine, reasoning_text

RBO_VARIANTS = {"rbo": overlap.rbo_truncated, "rbo_ext": overlap.rbo_extrapolated}


class TrajectoryError(ValueError):
    """Rows that do not form one well-formed trajectory."""


@dataclass
class _Iteration:
    row: Mapping[str, Any]
    index: int
    doc_ids: list[str]
    scores: list[float]
    retrieved: bool  # the row holds a retrieval (its list may be empty); iteration 0 does not


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _reasoning(row: Mapping[str, Any], settings: FeaturesConfig) -> str | None:
    return reasoning_text(_text(row.get("reasoning")), settings.reasoning_text)


def _prepare(rows: Sequence[Mapping[str, Any]]) -> list[_Iteration]:
    if not rows:
        raise TrajectoryError("a trajectory needs at least one iteration row")
    qids = {row["qid"] for row in rows}
    if len(qids) != 1:
        raise TrajectoryError(f"rows of several trajectories mixed: {sorted(qids)[:5]}")
    qid = rows[0]["qid"]
    ordered = sorted(rows, key=lambda r: r["iteration"])
    indices = [int(r["iteration"]) for r in ordered]
    if len(set(indices)) != len(indices):
        raise TrajectoryError(f"qid {qid!r}: duplicate iterations {indices}")
    out = []
    for row, index in zip(ordered, indices):
        doc_ids = list(row.get("doc_ids") or [])
        scores = [float(s) for s in (row.get("doc_scores") or [])]
        if len(doc_ids) != len(scores):
            raise TrajectoryError(f"qid {qid!r} iteration {index}: {len(doc_ids)} doc_ids but {len(scores)} doc_scores")
        out.append(_Iteration(row, index, doc_ids, scores, index >= 1 and row.get("doc_ids") is not None))
    return out


@dataclass
class _Needs:
    """What one trajectory asks of the encoders and the index (each list de-duplicated, in order)."""

    texts: list[str]  # sentence-encoder inputs: question, queries, reasoning
    doc_ids: list[str]  # documents whose vectors the dense signals read
    queries: list[str]  # queries with a retrieval list, for the index's query encoder
    search: str | None  # the question, when its own list is needed


def _needs(its: list[_Iteration], question: str | None, settings: FeaturesConfig) -> _Needs:
    retrieved = [it for it in its if it.doc_ids]
    texts = [question, *(_text(it.row.get("query")) for it in its), *(_reasoning(it.row, settings) for it in its)]
    depth = max(settings.a_pair_depth, settings.dense_qpp_k)
    return _Needs(
        texts=list(dict.fromkeys(t for t in texts if t is not None)),
        doc_ids=list(dict.fromkeys(d for it in retrieved for d in it.doc_ids[:depth])),
        queries=list(dict.fromkeys(q for q in (_text(it.row.get("query")) for it in retrieved) if q is not None)),
        search=question if question and retrieved else None,
    )


def extract_trajectory(
    rows: Sequence[Mapping[str, Any]],
    question: str | None,
    corpus: CorpusResources,
    sentences: SentenceEncoder,
    settings: FeaturesConfig | None = None,
) -> list[dict[str, Any]]:
    """Feature rows (FEATURES schema, ordered by iteration) for one trajectory's ITERATIONS rows.

    Each encoder and the index are called at most once per kind (see :func:`extract_many` for batches).
    ``settings``: the signals' depths and constants (default: the seed paper's).
    """
    settings = settings or FeaturesConfig()
    its = _prepare(rows)
    by_index = {it.index: it for it in its}
    question = _text(question)
    needs = _needs(its, question, settings)
    sent = dict(zip(needs.texts, sentences.encode(needs.texts))) if needs.texts else {}
    doc_vec = dict(zip(needs.doc_ids, corpus.doc_vectors(needs.doc_ids))) if needs.doc_ids else {}
    query_vec = dict(zip(needs.queries, corpus.encode_queries(needs.queries))) if needs.queries else {}
    question_list = corpus.search([needs.search], max(RBO_DEPTHS))[0] if needs.search else None
    missing = 0.0 if settings.rbo_missing == "zero" else None

    def embed(value: Any) -> np.ndarray | None:
        text = _text(value)
        return None if text is None else sent[text]

    out = []
    confs: dict[int, dict[str, float | None]] = {}
    first = by_index.get(0)
    for it in its:
        row = it.row
        previous = by_index.get(it.index - 1)  # a gap in the numbering leaves no previous iteration
        earlier = [e for e in its if e.index < it.index and e.retrieved]
        feats: dict[str, Any] = {
            "qid": row["qid"],
            "dataset": row["dataset"],
            "iteration": it.index,
            "probe_f1": row.get("probe_f1"),
            "utility": row.get("utility"),
        }
        feats.update(_qpp(it, corpus, doc_vec, query_vec, settings))
        for depth in RBO_DEPTHS:
            for name, fn in RBO_VARIANTS.items():

                def rbo(other: list[str] | None) -> float | None:
                    if not it.retrieved:  # noqa: B023 - rbo is called in this iteration
                        return None
                    if not it.doc_ids or not other:  # noqa: B023
                        return missing
                    return fn(it.doc_ids, other, depth, settings.rbo_p)  # noqa: B023

                feats[f"{name}_prev_{depth}"] = rbo(previous.doc_ids if previous else None)
                values = [v for v in (rbo(e.doc_ids) for e in earlier) if v is not None]
                feats[f"{name}_prevmax_{depth}"] = max(values) if values else (missing if it.retrieved else None)
                feats[f"{name}_question_{depth}"] = rbo(question_list) if question is not None else None

        reasoning = embed(_reasoning(row, settings))
        feats["sim_question_query"] = cosine(embed(question), embed(row.get("query")))
        feats["sim_reasoning_prev"] = cosine(embed(_reasoning(previous.row, settings)), reasoning) if previous else None
        feats["sim_reasoning_first"] = (
            cosine(embed(_reasoning(first.row, settings)), reasoning) if first is not None and it.index > 0 else None
        )

        logprobs = row.get("probe_token_logprobs")
        confs[it.index] = {
            "probe_conf": confidence.mean_logprob(logprobs, settings.confidence_drop_last),
            "probe_conf_full": confidence.mean_logprob(logprobs),
        }
        feats.update(confs[it.index])
        for name, value in confs[it.index].items():
            feats[f"{name}_delta"] = confidence.delta(value, confs[previous.index][name]) if previous else None
        out.append(feats)
    return out


def idf_lookup(query: str, corpus: CorpusResources, settings: FeaturesConfig) -> tuple[list[str], str]:
    """The terms NQC's max IDF looks ``query`` up by, and the lexicon they are looked up in: with
    ``features.nqc_idf=seed`` the seed's keys (:func:`qpp.seed_query_terms`) in the Terrier lexicon, as
    its Terrier index holds them; with ``true`` the statistics' own tokens in the plain lexicon."""
    if settings.nqc_idf == "seed":
        return qpp.seed_query_terms(query), "terrier"
    return corpus.terms(query), "plain"


def _qpp(
    it: _Iteration,
    corpus: CorpusResources,
    doc_vec: Mapping[str, np.ndarray],
    query_vec: Mapping[str, np.ndarray],
    settings: FeaturesConfig,
) -> dict[str, float | None]:
    if not it.doc_ids:
        return {"nqc_seed": None, "nqc_shtok": None, "a_pair_ratio": None, "dense_qpp": None}
    query = _text(it.row.get("query"))
    terms, lexicon = idf_lookup(query or "", corpus, settings)
    dfs = [corpus.document_frequency(t, lexicon) for t in terms]
    ids = it.doc_ids
    a_pair_n = min(settings.a_pair_depth, len(ids))
    dense_n = min(settings.dense_qpp_k, len(ids))
    return {
        "nqc_seed": qpp.nqc_seed(it.scores, qpp.max_idf(dfs, corpus.num_docs), settings.nqc_depth),
        "nqc_shtok": qpp.nqc_shtok(it.scores, settings.nqc_k),
        "a_pair_ratio": qpp.a_pair_ratio(np.vstack([doc_vec[d] for d in ids[:a_pair_n]]), it.scores, a_pair_n),
        "dense_qpp": (
            qpp.dense_qpp(query_vec[query], np.vstack([doc_vec[d] for d in ids[:dense_n]]), dense_n)
            if query is not None
            else None
        ),
    }


def extract_many(
    trajectories: Sequence[tuple[Sequence[Mapping[str, Any]], str | None]],
    corpus: CorpusResources,
    sentences: SentenceEncoder,
    settings: FeaturesConfig | None = None,
) -> list[list[dict[str, Any]]]:
    """:func:`extract_trajectory` over many ``(rows, question)`` pairs, with one batched call per encoder
    and one index search for all of them (what an actor does with a batch of trajectories)."""
    settings = settings or FeaturesConfig()
    needs = [_needs(_prepare(rows), _text(question), settings) for rows, question in trajectories]
    texts = list(dict.fromkeys(t for n in needs for t in n.texts))
    doc_ids = list(dict.fromkeys(d for n in needs for d in n.doc_ids))
    queries = list(dict.fromkeys(q for n in needs for q in n.queries))
    searches = list(dict.fromkeys(n.search for n in needs if n.search))
    k = max(RBO_DEPTHS)
    cached_corpus = _Prefetched(
        corpus,
        doc_vectors=dict(zip(doc_ids, corpus.doc_vectors(doc_ids))) if doc_ids else {},
        query_vectors=dict(zip(queries, corpus.encode_queries(queries))) if queries else {},
        lists={(q, k): ids for q, ids in zip(searches, corpus.search(searches, k))} if searches else {},
    )
    cached_sentences = _PrefetchedSentences(dict(zip(texts, sentences.encode(texts))) if texts else {})
    return [extract_trajectory(rows, q, cached_corpus, cached_sentences, settings) for rows, q in trajectories]


class _PrefetchedSentences:
    def __init__(self, vectors: Mapping[str, np.ndarray]):
        self.vectors = vectors

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


class _Prefetched:
    """A :class:`CorpusResources` answering from prefetched vectors and lists (statistics pass through)."""

    def __init__(self, corpus: CorpusResources, doc_vectors, query_vectors, lists):
        self.corpus = corpus
        self.num_docs = corpus.num_docs
        self._docs, self._queries, self._lists = doc_vectors, query_vectors, lists

    def terms(self, text: str) -> list[str]:
        return self.corpus.terms(text)

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        return self.corpus.document_frequency(term, lexicon)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.stack([self._docs[d] for d in doc_ids])

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._queries[t] for t in texts])

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        return [self._lists[(t, k)] for t in texts]
