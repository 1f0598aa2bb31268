"""The prediction head: an MLP with hidden layers (16, 8) over the windowed signals.

scikit-learn's MLPRegressor, not torch: the seed's torch head (Adam, lr 1e-3, weight decay 1e-3, batch
256, at most 300 epochs, early stopping with patience 15 on a 10% validation split, best weights kept)
maps one-to-one onto MLPRegressor's adam / learning_rate_init / alpha / batch_size / max_iter /
early_stopping / validation_fraction / n_iter_no_change (its validation score, R^2, orders models as
the validation MSE does, and it restores the best weights). A net this small gains nothing from a GPU,
and a fitted sklearn Pipeline (scaler + imputer + MLP) pickles into the bundle as one object.
Difference: alpha is an L2 penalty added to the loss rather than decoupled weight decay.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from raypipe.core.config import TrainConfig


def make_head(cfg: TrainConfig, seed: int = 0) -> Pipeline:
    """Scale observed values (NaN ignored), fill missing with 0 (= the mean), then the MLP."""
    mlp = MLPRegressor(
        hidden_layer_sizes=tuple(cfg.head_hidden),
        activation="relu",
        solver="adam",
        alpha=cfg.head_alpha,
        batch_size=cfg.head_batch_size,
        learning_rate_init=cfg.head_learning_rate,
        max_iter=cfg.head_max_iter,
        early_stopping=True,
        validation_fraction=cfg.head_validation_fraction,
        n_iter_no_change=cfg.head_patience,
        tol=0.0,
        random_state=seed,
    )
    return Pipeline(
        [
            ("scale", StandardScaler()),
            ("fill", SimpleImputer(strategy="constant", fill_value=0.0, keep_empty_features=True)),
            ("mlp", mlp),
        ]
    )


def fit_head(x: np.ndarray, y: np.ndarray, cfg: TrainConfig, seed: int = 0) -> Pipeline:
    keep = ~np.isnan(y)
    if keep.sum() < 10:
        raise ValueError(f"only {int(keep.sum())} rows with a target: too few to fit the head")
    head = make_head(cfg, seed)
    with warnings.catch_warnings():
        # batch_size above the row count is clipped; hitting max_iter is the seed's budget, not an error
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        warnings.filterwarnings("ignore", message=".*batch_size.*clipped")
        head.fit(x[keep], y[keep])
    return head


def out_of_fold(x: np.ndarray, y: np.ndarray, fold_of_row: np.ndarray, cfg: TrainConfig, seed: int = 0) -> np.ndarray:
    """Predictions for every row from a head fit on the other folds' questions."""
    pred = np.full(len(y), np.nan)
    for fold in np.unique(fold_of_row):
        test = fold_of_row == fold
        pred[test] = fit_head(x[~test], y[~test], cfg, seed).predict(x[test])
    return pred
