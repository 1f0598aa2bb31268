"""The cross-encoders are built and configured as the seed trains them (no weight decay, no dropout)."""

import pytest
import torch

from raypipe.core.config import TrainConfig
from raypipe.predict import crossencoder
from tests.helpers.tiny_models import tiny_bert


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _dropouts(model) -> list[float]:
    return [m.p for m in model.model.modules() if isinstance(m, torch.nn.Dropout)]


def test_seed_training_settings_reach_the_worker_loop(tiny_base):
    """DanielTian97/agentic_rag_predictions predictions/supervised/train.py: train(weight_decay=0.0,
    dropout_rate=0.0) (signature, lines 39-56) -> AdamW(lr, weight_decay) and build_regression_model(
    dropout_rate), which relations.py passes as hidden_dropout_prob and attention_probs_dropout_prob."""
    cfg = TrainConfig(base_model=tiny_base)
    assert (cfg.weight_decay, cfg.dropout) == (0.0, 0.0)
    loop = crossencoder.loop_config([], cfg, seed=0)
    assert (loop["weight_decay"], loop["dropout"]) == (0.0, 0.0)
    tasks = [crossencoder.Task("t", "intra_iteration", ["a", "b", "c", "d"], [0.1, 0.2, 0.3, 0.4])]
    key = crossencoder.task_key(tasks[0], cfg, 0)
    assert key != crossencoder.task_key(tasks[0], cfg.model_copy(update={"weight_decay": 0.01}), 0)
    assert key != crossencoder.task_key(tasks[0], cfg.model_copy(update={"dropout": None}), 0)


def test_no_dropout_anywhere_in_the_seeds_cross_encoder(tiny_base):
    """relations.py build_regression_model(dropout_rate=0.0): hidden and attention dropout 0, and so the
    classifier's (BERT's classifier dropout follows hidden_dropout_prob)."""
    model = crossencoder.new_crossencoder(tiny_base, "intra_iteration", dropout=0.0)
    config = model.model.config
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (0.0, 0.0)
    assert _dropouts(model) and set(_dropouts(model)) == {0.0}
    kept = crossencoder.new_crossencoder(tiny_base, "intra_iteration", dropout=None)  # the base model's own
    assert set(_dropouts(kept)) == {0.1}
    enc = model.tokenizer(["x [CURR_SUBQ] y"], return_tensors="pt")
    model.model.train()  # no dropout: training-mode outputs are deterministic
    with torch.no_grad():
        assert torch.equal(model.model(**enc).logits, model.model(**enc).logits)
