"""Stop-RAG's question splits: train (the Q-network), val (its threshold), test (the comparison)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raypipe.predict.splits import check_disjoint
from raypipe.stopping.replay import Trajectory, split_qids


@dataclass(frozen=True)
class Splits:
    train: set[str]
    val: set[str]
    test: set[str]


def split_three(qids: Sequence[str], shares: tuple[float, float, float], seed: int) -> Splits:
    """train/val/test by qid hash, through the shared evaluator's two-way split applied twice."""
    rest, train = split_qids(qids, 1.0 - shares[0], seed)
    val, test = split_qids(sorted(rest), shares[1] / (shares[1] + shares[2]), seed + 1)
    return Splits(train, val, test)


def split_train_run(
    train_t: Sequence[Trajectory], target_t: Sequence[Trajectory], shares: tuple[float, float, float], seed: int
) -> Splits:
    """train/val from the training run's questions (in the ratio of the first two ``shares``, by qid hash),
    test = every question of the target run; a question in both runs is an error."""
    train_qids, target_qids = [t.qid for t in train_t], [t.qid for t in target_t]
    check_disjoint(train_qids, target_qids)
    val, train = split_qids(train_qids, shares[1] / (shares[0] + shares[1]), seed)
    return Splits(train, val, set(target_qids))
