"""Recall of supporting paragraphs, the figure used to choose the embedded encoder.

A question's supporting paragraphs are named by title (``supporting_titles`` in the bundled question
files). Recall@k of one question = the fraction of its distinct supporting titles found among the titles
of the top-k retrieved passages; a dataset's recall@k is the mean over its questions that have
supporting titles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from raypipe.data.loaders import Question
from raypipe.retrieval.types import SearchResult


def recall_at_k(supporting_titles: Sequence[str], retrieved_titles: Sequence[str], k: int) -> float:
    gold = set(supporting_titles)
    if not gold:
        raise ValueError("recall needs at least one supporting title")
    return len(gold & set(retrieved_titles[:k])) / len(gold)


def dataset_recall(
    questions: Sequence[Question], results: Sequence[SearchResult], ks: Sequence[int] = (3, 10)
) -> dict[str, dict[str, float]]:
    """``{dataset: {"n": count, "recall@3": r, ...}}`` for questions with ``supporting_titles``."""
    if len(questions) != len(results):
        raise ValueError(f"{len(questions)} questions but {len(results)} results")
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for question, result in zip(questions, results):
        gold = question.extra.get("supporting_titles") or []
        if not gold:
            continue
        titles = [hit.title for hit in result.hits]
        row = sums[question.dataset]
        row["n"] += 1
        for k in ks:
            row[f"recall@{k}"] += recall_at_k(gold, titles, k)
    return {
        name: {"n": int(row["n"]), **{key: v / row["n"] for key, v in row.items() if key != "n"}}
        for name, row in sums.items()
    }
