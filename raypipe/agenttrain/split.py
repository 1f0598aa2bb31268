"""The fixed dev split of the bundled questions, and the training pool beside it.

Three disjoint groups of the bundled questions (hotpotqa, 2wikimultihopqa, musique):

- ``default``: the default run's questions (the embedded preset's ``data.limit`` first questions of each
  dataset; ``make run`` asks them), never trained on;
- ``dev``: every other question whose qid hashes into the first ``dev_percent`` of 100 buckets
  (``sha256(qid)``), a function of the qid alone, so neither file order nor a random state moves a question;
- ``train``: the rest, the only questions agent trajectories are made from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from raypipe.data.loaders import BUNDLED_DATASETS, Question, load_datasets


def in_dev(qid: str, dev_percent: int) -> bool:
    """Whether ``qid`` falls in the dev buckets: the first ``dev_percent`` of 100, by the qid's sha256."""
    return int(hashlib.sha256(qid.encode()).hexdigest()[:8], 16) % 100 < dev_percent


@dataclass(frozen=True)
class Split:
    default: list[Question]
    dev: list[Question]
    train: list[Question]

    def qids(self, part: str) -> list[str]:
        return [q.qid for q in getattr(self, part)]


def split_questions(questions: Iterable[Question], default_qids: Iterable[str], dev_percent: int) -> Split:
    """Assign each question to ``default`` (its qid among ``default_qids``), else ``dev`` or ``train`` by its qid."""
    default_set = set(default_qids)
    default, dev, train = [], [], []
    for q in questions:
        (default if q.qid in default_set else dev if in_dev(q.qid, dev_percent) else train).append(q)
    return Split(default, dev, train)


def bundled_split(default_limit: int, dev_percent: int) -> Split:
    """The split of every bundled question; ``default_limit`` is the default run's ``data.limit``."""
    names = list(BUNDLED_DATASETS)
    default_qids = [q.qid for q in load_datasets(names, default_limit)]
    return split_questions(load_datasets(names), default_qids, dev_percent)


def first_per_dataset(questions: Iterable[Question], n: int) -> list[Question]:
    """The first ``n`` questions of each dataset, in their order."""
    taken: dict[str, int] = {}
    kept = []
    for q in questions:
        taken[q.dataset] = taken.get(q.dataset, 0) + 1
        if taken[q.dataset] <= n:
            kept.append(q)
    return kept
