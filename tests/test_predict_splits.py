import numpy as np
import pandas as pd
import pytest

from raypipe.predict.splits import assign_folds, fold_column, train_test_masks


def _questions(n=23):
    return pd.DataFrame(
        {
            "qid": [f"q{i}" for i in range(n)],
            "dataset": ["hotpotqa", "2wiki", "musique"] * (n // 3) + ["musique"] * (n % 3),
        }
    )


def test_every_question_in_exactly_one_fold_and_balanced():
    questions = _questions()
    folds = assign_folds(questions, k=5, seed=1)
    assert set(folds) == set(questions["qid"])
    sizes = np.bincount(list(folds.values()), minlength=5)
    assert sizes.max() - sizes.min() <= 1
    for _, group in questions.groupby("dataset"):
        per = np.bincount([folds[q] for q in group["qid"]], minlength=5)
        assert per.max() - per.min() <= 1  # stratified by dataset
    assert assign_folds(questions, 5, seed=1) == folds  # deterministic
    assert assign_folds(questions, 5, seed=2) != folds


def test_no_question_on_both_sides():
    questions = _questions()
    rows = questions.loc[np.repeat(questions.index, 3)].reset_index(drop=True)  # 3 iterations per question
    rows["iteration"] = np.tile([1, 2, 3], len(questions))
    fold_of_row = fold_column(rows, assign_folds(questions, 4))
    covered = np.zeros(len(rows), bool)
    for fold in range(4):
        train, test = train_test_masks(fold_of_row, fold)
        assert not set(rows.loc[train, "qid"]) & set(rows.loc[test, "qid"])
        assert not (train & test).any()
        covered |= test
    assert covered.all()  # every row is predicted out of fold once


def test_split_errors():
    questions = _questions(3)
    with pytest.raises(ValueError, match="k >= 2"):
        assign_folds(questions, 1)
    with pytest.raises(ValueError, match="cannot fill"):
        assign_folds(questions, 5)
    with pytest.raises(ValueError, match="duplicated"):
        assign_folds(pd.concat([questions, questions]), 2)
    with pytest.raises(ValueError, match="no fold"):
        fold_column(pd.DataFrame({"qid": ["zz"]}), {"q0": 0})
