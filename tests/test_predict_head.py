"""The prediction head: the seed's torch MLP by default, its input preprocessing, the sklearn option and
the derivation of its equivalent alpha, held-out fitting."""

import numpy as np
import pytest
import torch
from sklearn.impute import SimpleImputer
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from raypipe.core.config import TrainConfig
from raypipe.predict.head import NOT_PREDICTED, SeedMLP, equivalent_alpha, fit_head, make_head, out_of_fold


def _data(n=240, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return x, 0.5 * x[:, 0] - 0.2 * x[:, 1] + rng.normal(0, 0.1, n)


def test_default_head_is_the_seeds_torch_mlp():
    """DanielTian97/agentic_rag_predictions predictions/prediction_head/mlp.py: build_prediction_head (the
    file's last function): hidden (16, 8), batch 256, lr 1e-3, weight decay 1e-3, 300 epochs, 10%
    validation, patience 15; TorchMLPRegressor (lines 37-51, 60-61, 81-86): SimpleImputer(constant 0),
    then StandardScaler, Linear/ReLU layers, Adam(weight_decay) on nn.MSELoss."""
    head = make_head(TrainConfig(), seed=7)
    (fill_name, fill), (scale_name, scale), (_, mlp) = head.steps
    assert (fill_name, scale_name) == ("fill", "scale")  # imputation before scaling
    assert isinstance(fill, SimpleImputer) and fill.strategy == "constant" and fill.fill_value == 0.0
    assert isinstance(scale, StandardScaler) and isinstance(mlp, SeedMLP)
    assert mlp.get_params() == {
        "hidden_layer_sizes": (16, 8),
        "batch_size": 256,
        "learning_rate": 1e-3,
        "weight_decay": 1e-3,
        "max_epochs": 300,
        "validation_fraction": 0.1,
        "patience": 15,
        "random_state": 7,
    }
    net = mlp.build(5)
    assert [type(m).__name__ for m in net] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    (group,) = mlp.optimizer(net).param_groups
    assert group["weight_decay"] == 1e-3 and len(group["params"]) == 6  # every weight and bias decayed
    assert isinstance(mlp.optimizer(net), torch.optim.Adam)


def test_seed_input_sets_nan_to_zero_before_scaling():
    """mlp.py lines 60-61: X = imputer.fit_transform(X) (constant 0), then scaler.fit_transform."""
    x = np.array([[1.0, np.nan], [3.0, 2.0], [5.0, 4.0], [np.nan, np.nan]])
    head = make_head(TrainConfig())
    seen = head[:-1].fit_transform(x)
    expected = StandardScaler().fit_transform(np.nan_to_num(x, nan=0.0))
    np.testing.assert_allclose(seen, expected)
    # the indicators option scales the observed values first, then fills with 0 (the mean)
    other = make_head(TrainConfig(head_input="indicators"))[:-1].fit_transform(x)
    assert other[3, 0] == 0.0 and not np.allclose(other, expected)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # one epoch only sets the weights
def test_equivalent_alpha_gives_the_weight_decay_gradient_on_weights_but_not_biases():
    """sklearn 1.9 neural_network/_multilayer_perceptron.py _backprop / _compute_loss_grad: the loss is
    0.5 * MSE + (alpha / 2) * ||W||^2 / B, the weight gradient (X^T delta + alpha W) / B, intercepts
    unpenalised. Twice that gradient equals torch's MSE gradient plus Adam's weight-decay term wd * W
    (mlp.py lines 81-86: Adam(weight_decay=1e-3) on nn.MSELoss) for alpha = wd * B / 2; for biases the
    decay term is missing, so the sklearn head cannot be the seed's exactly."""
    wd, batch = 1e-3, 64
    assert equivalent_alpha(1e-3, 256) == pytest.approx(0.128)
    x, y = _data(batch)
    mlp = MLPRegressor(
        hidden_layer_sizes=(4,), alpha=equivalent_alpha(wd, batch), batch_size=batch, max_iter=1, random_state=0
    ).fit(x, y)
    layers = mlp.n_layers_
    activations = [x] + [None] * (layers - 1)
    deltas = [None] * (layers - 1)
    coef_grads = [np.empty_like(c) for c in mlp.coefs_]
    intercept_grads = [np.empty_like(b) for b in mlp.intercepts_]
    mlp._backprop(x, y.reshape(-1, 1), None, activations, deltas, coef_grads, intercept_grads)

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    with torch.no_grad():
        for linear, w, b in zip((net[0], net[2]), mlp.coefs_, mlp.intercepts_):
            linear.weight.copy_(torch.from_numpy(w.T))
            linear.bias.copy_(torch.from_numpy(b))
    torch.nn.MSELoss()(net(torch.from_numpy(x)).squeeze(-1), torch.from_numpy(y)).backward()
    for linear, gw, gb in zip((net[0], net[2]), coef_grads, intercept_grads):
        adam_weight = linear.weight.grad + wd * linear.weight  # what Adam(weight_decay=wd) steps on
        np.testing.assert_allclose(2 * gw.T, adam_weight.detach().numpy(), rtol=1e-9, atol=1e-12)
        adam_bias = linear.bias.grad + wd * linear.bias
        np.testing.assert_allclose(2 * gb, linear.bias.grad.numpy(), rtol=1e-9, atol=1e-12)
        assert not np.allclose(2 * gb, adam_bias.detach().numpy(), rtol=0, atol=1e-9)


def test_sklearn_head_is_the_named_option_with_todays_settings():
    """raypipe's head before the seed's: MLPRegressor after scaling and zero fill; alpha as given, or
    derived from the weight decay when unset."""
    today = make_head(TrainConfig(head="sklearn", head_input="indicators", head_alpha=1e-3))
    assert [name for name, _ in today.steps] == ["scale", "fill", "mlp"]
    assert isinstance(today[-1], MLPRegressor) and today[-1].alpha == 1e-3
    assert make_head(TrainConfig(head="sklearn"))[-1].alpha == pytest.approx(0.128)


def test_seed_mlp_learns_is_deterministic_and_leaves_torch_state_alone():
    x, y = _data()
    cfg = TrainConfig()
    state = torch.random.get_rng_state()
    first = fit_head(x, y, cfg, seed=3)
    assert torch.equal(state, torch.random.get_rng_state())
    again = fit_head(x, y, cfg, seed=3)
    np.testing.assert_array_equal(first.predict(x), again.predict(x))
    assert np.corrcoef(first.predict(x), y)[0, 1] > 0.9
    assert not np.array_equal(first.predict(x), fit_head(x, y, cfg, seed=4).predict(x))
    assert first[-1].epochs_ <= cfg.head_max_iter


def test_not_predicted_rows_are_only_trained_on_and_trainable_limits_the_fits():
    """Train on a training run, predict the target run: fold NOT_PREDICTED rows train, fold 0 rows are
    predicted by a head that never saw them (their targets cannot change their predictions)."""
    x, y = _data(200)
    cfg = TrainConfig(head_max_iter=50)
    fold = np.where(np.arange(200) < 150, NOT_PREDICTED, 0)
    pred = out_of_fold(x, y, fold, cfg)
    assert np.isnan(pred[:150]).all() and np.isfinite(pred[150:]).all()
    y2 = y.copy()
    y2[150:] = 0.0  # the target rows' targets
    np.testing.assert_array_equal(out_of_fold(x, y2, fold, cfg), pred)
    # k-fold among training rows, the target rows their own fold, never trained on
    folds = np.where(np.arange(200) < 150, np.arange(200) % 3, 3)
    trainable = np.arange(200) < 150
    both = out_of_fold(x, y, folds, cfg, trainable=trainable)
    np.testing.assert_array_equal(both, out_of_fold(x, y2, folds, cfg, trainable=trainable))
    np.testing.assert_array_equal(both[150:], pred[150:])  # fold 3 fits on every training row, as fold 0 did
