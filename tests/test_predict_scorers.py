"""The bundle's cross-encoders run by ONNX Runtime give torch's predictions (fp32, within 1e-4), in any batching."""

import numpy as np
import pytest
import torch

from raypipe.predict import crossencoder
from raypipe.predict.scorers import OnnxScorer, TorchScorer
from tests.helpers.tiny_models import tiny_bert

TOLERANCE = 1e-4  # largest |onnx - torch| allowed (docs: raypipe/predict/scorers.py)
TEXTS = [
    "who wrote hamlet [SEP] i need the author [CURR_SUBQ] hamlet author [CURR_TITLE] Hamlet [CURR_INFO] a play",
    "q [SEP] r [CURR_SUBQ] s",
    "where was the author of hamlet born [SEP] the author is shakespeare, now his birthplace "
    "[CURR_SUBQ] shakespeare birthplace [CURR_TITLE] Stratford-upon-Avon [CURR_INFO] " + "a market town " * 40,
    "[CURR_SUBQ] [CURR_TITLE] [CURR_INFO]",
    "which river runs through the town [SEP] look it up [CURR_SUBQ] river Avon [CURR_TITLE] Avon [CURR_INFO] river",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny cross-encoder with the relation's marker tokens, fitted for a few steps as training does (MSE)."""
    torch.manual_seed(0)
    model = crossencoder.new_crossencoder(tiny_bert(tmp_path_factory.mktemp("base")), "intra_iteration", dropout=0.0)
    net, tok = model.model, model.tokenizer
    optimizer = torch.optim.AdamW(net.parameters(), lr=5e-3, weight_decay=0.0)
    batch = tok(TEXTS, truncation=True, max_length=64, padding=True, return_tensors="pt")
    labels = torch.tensor([0.9, 0.1, 0.5, 0.0, 0.7])
    net.train()
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(net(**batch).logits.squeeze(-1), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder = tmp_path_factory.mktemp("crossencoder")
    model.save(str(folder))
    return folder


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPIPE_CACHE", str(tmp_path / "cache"))  # the export is written where the test looks


@pytest.mark.parametrize("max_tokens", [16, 64])
def test_onnx_equals_torch_within_tolerance(trained, max_tokens):
    reference = TorchScorer(trained, batch_size=64).score(TEXTS, max_tokens)
    assert np.ptp(reference) > 1e-3  # the model tells the texts apart: equal outputs would prove nothing
    onnx = OnnxScorer(trained, batch_size=64).score(TEXTS, max_tokens)
    assert np.abs(onnx - reference).max() < TOLERANCE


def test_onnx_batching_changes_nothing(trained):
    """One text per forward, batches of 2 and one padded batch of all: the same scores, in the input's order."""
    scores = [OnnxScorer(trained, batch_size=size).score(TEXTS, 64) for size in (1, 2, 64)]
    for other in scores[1:]:
        assert np.abs(other - scores[0]).max() < 1e-5
    assert OnnxScorer(trained, batch_size=4).score([], 64).shape == (0,)
