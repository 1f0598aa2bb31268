"""The bundle's cache of cross-encoder scores: a window's texts are scored once across decisions, and the cache
stays within its bound (a service asks about new trajectories for days) without losing a score a call needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from raypipe.predict.bundle import PredictorBundle, ScoreCache

COLUMN = "sup_p_ii"


class CountingScorer:
    """Scores a text by its length; records every text it is asked to score."""

    def __init__(self):
        self.seen: list[str] = []

    def score(self, texts, max_tokens):
        self.seen.extend(texts)
        return [float(len(t)) for t in texts]


def bundle(scorer: CountingScorer) -> PredictorBundle:
    manifest = {
        "feature_group": "sup",
        "window": 2,
        "feature_columns": [COLUMN],
        "crossencoders": {COLUMN: "crossencoders/ii"},
        "train": {"max_tokens": 128, "field_chars": 400, "title_chars": 60},
    }
    return PredictorBundle(Path("unused"), manifest, heads={}, scorers={COLUMN: scorer})


def history(qid: str, last: int) -> tuple[list[dict], str]:
    rows = [
        {
            "qid": qid,
            "iteration": i,
            "query": None if i == 0 else f"{qid} query {i}",
            "reasoning": f"<think>{qid} step {i}</think>",
            "doc_titles": [f"Title {i}"],
            "doc_texts": [f"text of {qid} {i}" * (i + 1)],
        }
        for i in range(last + 1)
    ]
    return rows, f"question {qid}?"


def test_a_window_is_scored_once_across_decisions():
    scorer = CountingScorer()
    made = bundle(scorer)
    first = made.feature_frames([history("a", 1), history("b", 2)])
    assert len(scorer.seen) == 3  # a: 1; b: 1 and 2 (window 2)
    second = made.feature_frames([history("a", 2), history("b", 2)])
    assert len(scorer.seen) == 4  # only a's new iteration
    assert second[1][COLUMN].tolist() == first[1][COLUMN].tolist()
    assert second[0][COLUMN].iloc[0] == first[0][COLUMN].iloc[0]  # a's iteration 1, from the cache


def test_the_cache_is_bounded_and_a_call_keeps_the_scores_it_needs():
    scorer = CountingScorer()
    made = bundle(scorer)
    made._sup_cache = ScoreCache(size=2)
    frames = made.feature_frames([history("a", 2), history("b", 2)])  # four texts into a cache of two
    assert len(made._sup_cache) == 2
    assert [f[COLUMN].tolist() for f in frames] == [
        [float(len(t)) for t in scorer.seen[0:2]],
        [float(len(t)) for t in scorer.seen[2:4]],
    ]


def test_least_recently_used_goes_first():
    cache = ScoreCache(size=2)
    cache[("a", 1, "c")] = 1.0
    cache[("b", 1, "c")] = 2.0
    assert cache[("a", 1, "c")] == 1.0  # a used: b is now the oldest
    cache[("c", 1, "c")] = 3.0
    assert ("b", 1, "c") not in cache and ("a", 1, "c") in cache and len(cache) == 2
    with pytest.raises(KeyError):
        cache[("b", 1, "c")]
