"""Question-level splits: k folds of questions, stratified by dataset, never split by row.

Every iteration of a question lands in the same fold, so a model trained on the other folds never saw
any iteration of the questions it predicts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def assign_folds(questions: pd.DataFrame, k: int, seed: int = 0) -> dict[str, int]:
    """qid -> fold in [0, k): questions shuffled within each dataset and dealt round-robin.

    ``questions`` has one row per qid with columns qid and dataset. Dealing continues across datasets,
    so fold sizes differ by at most one overall and by at most one within each dataset.
    """
    if k < 2:
        raise ValueError(f"k-fold needs k >= 2, got {k}")
    if questions["qid"].duplicated().any():
        raise ValueError("assign_folds wants one row per question; got duplicated qids")
    if len(questions) < k:
        raise ValueError(f"{len(questions)} questions cannot fill {k} folds")
    rng = np.random.default_rng(seed)
    folds: dict[str, int] = {}
    offset = 0
    for _, group in questions.sort_values(["dataset", "qid"]).groupby("dataset", sort=True):
        qids = group["qid"].to_numpy()
        for pos, idx in enumerate(rng.permutation(len(qids))):
            folds[str(qids[idx])] = (offset + pos) % k
        offset += len(qids)
    return folds


def fold_column(frame: pd.DataFrame, folds: dict[str, int]) -> np.ndarray:
    """The fold of every row of ``frame`` (by its qid); a qid without a fold is an error."""
    missing = set(frame["qid"]) - set(folds)
    if missing:
        raise ValueError(f"{len(missing)} qids have no fold, e.g. {sorted(missing)[:3]}")
    return frame["qid"].map(folds).to_numpy(dtype=np.int64)


def train_test_masks(fold_of_row: np.ndarray, fold: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean row masks: train = every other fold, test = this fold."""
    test = fold_of_row == fold
    return ~test, test


def check_disjoint(
    train_qids, target_qids, train_name: str = "the training run", target_name: str = "this run"
) -> None:
    """Fail when a question is in both runs (the seed paper trains on train splits and evaluates on dev)."""
    both = sorted(set(map(str, train_qids)) & set(map(str, target_qids)))
    if both:
        shown = ", ".join(both[:10]) + (f" and {len(both) - 10} more" if len(both) > 10 else "")
        raise ValueError(f"{len(both)} questions are in both {train_name} and {target_name}: {shown}")


def protocol_note(train_run: str | None, folds: int | None = None) -> str:
    """One line naming the evaluation protocol of a table."""
    if train_run:
        return f"protocol: trained on the run {train_run}, evaluated on this run's questions (the paper's train/dev)"
    return "protocol: cross-fitting within this run" + (f" ({folds}-fold by question)" if folds else "")
