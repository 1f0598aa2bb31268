"""The prediction head: an MLP with hidden layers (16, 8) over the windowed signals.

Two heads (``train.head``), both a fitted scikit-learn Pipeline (preprocessing + MLP) that pickles into
the bundle as one object:

- ``seed`` (default): :class:`SeedMLP`, the seed's torch head (DanielTian97/agentic_rag_predictions
  ``predictions/prediction_head/mlp.py``, ``TorchMLPRegressor``: Linear/ReLU layers, Adam with lr 1e-3 and
  weight decay 1e-3 on ``nn.MSELoss``, batch 256 shuffled, at most 300 epochs, a 10% validation split by
  ``train_test_split``, patience 15 on the validation MSE, the best weights restored);
- ``sklearn``: scikit-learn's MLPRegressor with the same sizes and schedule (raypipe's head before).

Why scikit-learn cannot express the seed's regularisation exactly. torch's ``Adam(weight_decay=wd)``
adds ``wd * theta`` to the gradient of the batch MSE ``(1/B) sum (yhat - y)^2`` for every parameter,
biases included. scikit-learn 1.9's MLPRegressor (``neural_network/_multilayer_perceptron.py``,
``_backprop`` / ``_compute_loss_grad``) minimises ``0.5 * MSE + (alpha / 2) * ||W||^2 / B`` over the
weight matrices only: its weight gradient is ``0.5 * dMSE/dW + (alpha / B) * W``. Adam's update is
invariant to a constant factor on the gradient (up to its eps), so doubling gives ``dMSE/dW +
(2 alpha / B) * W``: the same update as the seed's for ``alpha = wd * B / 2`` (0.128 for the seed's
1e-3 and B = 256; :func:`equivalent_alpha`). It still differs in two places: the biases are never
decayed, and the last, smaller batch of an epoch (B' = rows mod 256) gets ``2 alpha / B'`` instead of
``wd``. Hence the torch head is the default and the derived alpha the sklearn head's default.

Inputs (``train.head_input``): ``seed`` imputes NaN as 0 and then standard-scales (mlp.py: SimpleImputer
constant 0, which drops a column never observed, then StandardScaler); ``indicators`` scales the observed values and
then fills NaN with 0 (the training mean), for windows with missing-slot indicators (:mod:`raypipe.predict.window`).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from raypipe.core.config import TrainConfig

NOT_PREDICTED = -1  # fold of a row that is only trained on (the training run's rows under --train-run)


def equivalent_alpha(weight_decay: float, batch_size: int) -> float:
    """scikit-learn's ``alpha`` whose weight update equals torch Adam's ``weight_decay`` on full batches."""
    return weight_decay * batch_size / 2


class SeedMLP(RegressorMixin, BaseEstimator):
    """The seed's torch MLP regressor (mlp.py ``TorchMLPRegressor.fit``), on the CPU.

    The random stream is the seed's: ``torch.manual_seed(random_state)`` before the layers are built
    and the shuffled loader draws, run inside ``torch.random.fork_rng`` so the caller's torch state is
    left untouched; one torch thread while fitting (a net this small gains nothing from more).
    """

    def __init__(
        self,
        hidden_layer_sizes: tuple[int, ...] = (16, 8),
        batch_size: int = 256,
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-3,
        max_epochs: int = 300,
        validation_fraction: float = 0.1,
        patience: int = 15,
        random_state: int = 0,
    ):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.max_epochs = max_epochs
        self.validation_fraction = validation_fraction
        self.patience = patience
        self.random_state = random_state

    def build(self, input_dim: int):
        import torch.nn as nn

        layers, previous = [], input_dim
        for width in self.hidden_layer_sizes:
            layers += [nn.Linear(previous, width), nn.ReLU()]
            previous = width
        layers.append(nn.Linear(previous, 1))
        return nn.Sequential(*layers)

    def optimizer(self, net):
        """Adam with coupled L2 weight decay on every parameter, biases included (mlp.py)."""
        import torch

        return torch.optim.Adam(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)

    def fit(self, X, y):
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.float32)
        x_train, x_val, y_train, y_val = train_test_split(
            X, y, test_size=self.validation_fraction, random_state=self.random_state
        )
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.random_state)
                net = self.build(X.shape[1])
                loader = DataLoader(
                    TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
                    batch_size=self.batch_size,
                    shuffle=True,
                )
                self.net_, self.epochs_ = self._train(net, loader, torch.from_numpy(x_val), torch.from_numpy(y_val))
        finally:
            torch.set_num_threads(threads)
        self.n_features_in_ = X.shape[1]
        return self

    def _train(self, net, loader, x_val, y_val):
        import torch

        optimizer, loss_fn = self.optimizer(net), torch.nn.MSELoss()
        best_loss, best_state, stale, epoch = float("inf"), None, 0, 0
        for epoch in range(1, self.max_epochs + 1):  # noqa: B007 - returned: the epochs run
            net.train()
            for xb, yb in loader:
                optimizer.zero_grad()
                loss_fn(net(xb).squeeze(-1), yb).backward()
                optimizer.step()
            net.eval()
            with torch.no_grad():
                val_loss = loss_fn(net(x_val).squeeze(-1), y_val).item()
            if val_loss < best_loss:
                best_loss, best_state, stale = val_loss, copy.deepcopy(net.state_dict()), 0
            else:
                stale += 1
            if stale >= self.patience:
                break
        if best_state is not None:
            net.load_state_dict(best_state)
        return net.eval(), epoch

    def predict(self, X):
        import torch

        with torch.no_grad():
            return self.net_(torch.from_numpy(np.asarray(X, dtype=np.float32))).squeeze(-1).numpy().astype(np.float64)


def preprocessing(cfg: TrainConfig) -> list[tuple[str, object]]:
    """The steps before the MLP (``train.head_input``)."""
    if cfg.head_input == "seed":  # mlp.py's SimpleImputer defaults: a column never observed is dropped
        return [("fill", SimpleImputer(strategy="constant", fill_value=0.0)), ("scale", StandardScaler())]
    return [
        ("scale", StandardScaler()),
        ("fill", SimpleImputer(strategy="constant", fill_value=0.0, keep_empty_features=True)),
    ]


def make_head(cfg: TrainConfig, seed: int = 0) -> Pipeline:
    """Preprocessing, then the seed's torch MLP or scikit-learn's MLPRegressor (``train.head``)."""
    if cfg.head == "seed":
        mlp = SeedMLP(
            hidden_layer_sizes=tuple(cfg.head_hidden),
            batch_size=cfg.head_batch_size,
            learning_rate=cfg.head_learning_rate,
            weight_decay=cfg.head_weight_decay,
            max_epochs=cfg.head_max_iter,
            validation_fraction=cfg.head_validation_fraction,
            patience=cfg.head_patience,
            random_state=seed,
        )
    else:
        alpha = (
            cfg.head_alpha
            if cfg.head_alpha is not None
            else equivalent_alpha(cfg.head_weight_decay, cfg.head_batch_size)
        )
        mlp = MLPRegressor(
            hidden_layer_sizes=tuple(cfg.head_hidden),
            activation="relu",
            solver="adam",
            alpha=alpha,
            batch_size=cfg.head_batch_size,
            learning_rate_init=cfg.head_learning_rate,
            max_iter=cfg.head_max_iter,
            early_stopping=True,
            validation_fraction=cfg.head_validation_fraction,
            n_iter_no_change=cfg.head_patience,
            tol=0.0,
            random_state=seed,
        )
    return Pipeline([*preprocessing(cfg), ("mlp", mlp)])


def fit_head(x: np.ndarray, y: np.ndarray, cfg: TrainConfig, seed: int = 0) -> Pipeline:
    keep = ~np.isnan(y)
    if keep.sum() < 10:
        raise ValueError(f"only {int(keep.sum())} rows with a target: too few to fit the head")
    head = make_head(cfg, seed)
    with warnings.catch_warnings():
        # batch_size above the row count is clipped; hitting max_iter is the seed's budget, not an error
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        warnings.filterwarnings("ignore", message=".*batch_size.*clipped")
        warnings.filterwarnings("ignore", message="Skipping features without any observed values")
        head.fit(x[keep], y[keep])
    return head


def out_of_fold(
    x: np.ndarray,
    y: np.ndarray,
    fold_of_row: np.ndarray,
    cfg: TrainConfig,
    seed: int = 0,
    trainable: np.ndarray | None = None,
) -> np.ndarray:
    """Predictions for every row of a fold >= 0 from a head fit on the (``trainable``) rows of the other folds.

    Rows of fold :data:`NOT_PREDICTED` are trained on and never predicted (NaN): with the training run's
    rows there and the target run's rows in fold 0, this is train-on-one-run, predict-the-other.
    ``trainable`` (default every row) keeps rows out of every fit, e.g. a target run's rows.
    """
    trainable = np.ones(len(y), bool) if trainable is None else np.asarray(trainable, bool)
    pred = np.full(len(y), np.nan)
    for fold in np.unique(fold_of_row):
        if fold == NOT_PREDICTED:
            continue
        test = fold_of_row == fold
        train = ~test & trainable
        pred[test] = fit_head(x[train], y[train], cfg, seed).predict(x[test])
    return pred
