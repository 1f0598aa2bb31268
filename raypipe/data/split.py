"""The fixed dev split of the bundled questions, and the training pool beside it.

Three disjoint groups of the bundled questions (hotpotqa, 2wikimultihopqa, musique):

- ``default``: the default run's questions (the first :data:`DEFAULT_RUN_LIMIT` of each dataset, the embedded
  preset's ``data.limit``: ``make run`` asks them), never trained on;
- ``dev``: every other question whose qid hashes into the first ``dev_percent`` of 100 buckets
  (``sha256(qid)``), a function of the qid alone, so neither file order nor a random state moves a question;
- ``train``: the rest, the only questions agent trajectories are made from.

A run asks one part with ``data.split`` (:func:`run_questions`): ``raypipe probe --set data.split=dev`` is the
tuned agent's dev evaluation (docs/agent-training.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from raypipe.core.config import DataConfig
from raypipe.data.loaders import BUNDLED_DATASETS, DataError, Question, load_datasets

DEFAULT_RUN_LIMIT = 4  # the embedded preset's data.limit (a test holds them equal)


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


def bundled_split(dev_percent: int, names: Iterable[str] = BUNDLED_DATASETS) -> Split:
    """The split of the bundled questions of ``names`` (every bundled dataset by default)."""
    names = list(names)
    default_qids = [q.qid for q in load_datasets(names, DEFAULT_RUN_LIMIT)]
    return split_questions(load_datasets(names), default_qids, dev_percent)


def run_questions(data: DataConfig, dev_percent: int) -> list[Question]:
    """The questions a run asks: its datasets' first ``data.limit``, or, with ``data.split`` set, the first
    ``data.limit`` (all when unset) of that part of the bundled split, each dataset in its file order."""
    if data.split == "all":
        return load_datasets(data.datasets, data.limit, data.limit_files)
    if unknown := [name for name in data.datasets if name not in BUNDLED_DATASETS]:
        raise DataError(f"data.split={data.split} splits the bundled datasets only, not {', '.join(unknown)}")
    part = getattr(bundled_split(dev_percent, data.datasets), data.split)
    return part if data.limit is None else first_per_dataset(part, data.limit)


def first_per_dataset(questions: Iterable[Question], n: int) -> list[Question]:
    """The first ``n`` questions of each dataset, in their order."""
    taken: dict[str, int] = {}
    kept = []
    for q in questions:
        taken[q.dataset] = taken.get(q.dataset, 0) + 1
        if taken[q.dataset] <= n:
            kept.append(q)
    return kept
