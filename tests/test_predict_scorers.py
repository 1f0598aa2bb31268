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


def bundle_with(trained, folder, backend):
    """A bundle whose heads read one cross-encoder signal (sup_p_ii) over a window of 2."""
    import json
    import pickle
    import shutil

    from raypipe.core.config import TrainConfig
    from raypipe.predict.bundle import PredictorBundle
    from raypipe.predict.head import fit_head

    if not (folder / "manifest.json").exists():
        shutil.copytree(trained, folder / "crossencoders" / "sup_p_ii")
        rng = np.random.default_rng(0)
        x = rng.normal(0.5, 0.3, size=(200, 2))  # (current, previous) signal: what the window of 2 feeds the head
        for short, y in (("p", x[:, 0]), ("u", x[:, 0] - x[:, 1])):
            with open(folder / f"head_{short}.pkl", "wb") as fh:
                pickle.dump(fit_head(x, y, TrainConfig(head_batch_size=32)), fh)
        manifest = {
            "feature_group": "sup",
            "window": 2,
            "feature_columns": ["sup_p_ii"],
            "crossencoders": {"sup_p_ii": "crossencoders/sup_p_ii"},
            "train": {"max_tokens": 64, "field_chars": 256, "title_chars": 128},
            "window_options": {"indicators": False},
        }
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return PredictorBundle.load(folder, scorer_backend=backend)


def history(qid, n):
    return [
        {
            "qid": qid,
            "iteration": i,
            "query": None if i == 0 else f"{qid} query {i}",
            "reasoning": f"thinking about {qid} step {i} " * (1 + i),
            "doc_ids": None if i == 0 else [f"d{i}"],
            "doc_titles": [] if i == 0 else [f"Title {qid} {i}"],
            "doc_texts": [] if i == 0 else [f"text of {qid} at {i} " * (2 * i)],
        }
        for i in range(n + 1)
    ]


@pytest.mark.filterwarnings("ignore:Stochastic Optimizer")
def test_a_bundle_predicts_the_same_batched_or_alone_on_either_backend(trained, tmp_path):
    """predict_many over trajectories of several lengths equals predict on each alone, and the ONNX bundle's
    (P̂, Û) equal the torch bundle's within the tolerance."""
    histories = [(history(f"q{k}", n), f"question {k}?") for k, n in enumerate((1, 3, 2, 4))]
    torch_bundle = bundle_with(trained, tmp_path / "bundle", "torch")
    alone = [torch_bundle.predict(rows, question) for rows, question in histories]
    onnx = bundle_with(trained, tmp_path / "bundle", "onnx").predict_many(histories)
    assert len({round(p, 4) for p, _ in alone}) > 1  # the trajectories differ: equal outputs would prove nothing
    assert np.abs(np.asarray(onnx) - np.asarray(alone)).max() < TOLERANCE
    batched = bundle_with(trained, tmp_path / "bundle", "torch").predict_many(histories)
    assert np.abs(np.asarray(batched) - np.asarray(alone)).max() < 1e-6
