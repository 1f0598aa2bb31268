"""The Q-network and a small Ray Train run (a tiny random BERT with MiniLM's tokenizer, to stay fast)."""

import math

import pytest

pytest.importorskip("torch")

from raypipe.core.config import StopRagConfig
from raypipe.stoprag.qnet import QNetwork, load_tokenizer, score
from raypipe.stoprag.targets import Episode, training_samples
from raypipe.stoprag.train import cont_targets, worker_share


def test_qnetwork_heads_save_load(tiny_encoder, tmp_path):
    net = QNetwork(tiny_encoder, pooling="mean", dropout=0.0).eval()
    tok = load_tokenizer(tiny_encoder)
    s, c = score(net, tok, ["a question", "another one with documents"], max_length=16)
    assert len(s) == len(c) == 2 and all(math.isfinite(v) for v in s + c)
    net.save(tmp_path / "q", tok, extra={"threshold": 0.25})
    again, meta = QNetwork.load(tmp_path / "q")
    assert meta["threshold"] == 0.25 and meta["pooling"] == "mean"
    assert score(again, tok, ["a question", "another one with documents"], max_length=16) == (s, c)
    with pytest.raises(FileNotFoundError, match="not a saved Stop-RAG"):
        QNetwork.load(tmp_path)


def test_targets_bootstrap_from_the_network(tiny_encoder):
    """Q(0) targets equal max(Q_stop, Q_cont) of the next state as the network scores it."""
    net = QNetwork(tiny_encoder, dropout=0.5)  # train mode: bootstrap must still be deterministic (eval)
    tok = load_tokenizer(tiny_encoder)
    texts, samples = training_samples([Episode("a", (1, 2, 3), ("x", "y", "z"), (0.2, 0.5, 1.0))])
    cfg = StopRagConfig(target="q0", max_length=16)
    first = cont_targets(net, tok, texts, samples, cfg, 0.0)
    assert net.training
    net.eval()
    s, c = score(net, tok, ["y"], 16)
    assert first[0] == pytest.approx(max(s[0], c[0]))
    assert first[1] == 1.0  # next state terminal: r_T
    assert cont_targets(net, tok, texts, samples, cfg.model_copy(update={"target": "mc"}), 0.3) == [1.0, 1.0]


@pytest.mark.slow
def test_ray_train_run_learns_and_checkpoints(tiny_encoder, tmp_path, ray_local):
    from raypipe.stages.stoprag import train_qnetwork

    # "good" states should be stopped at (reward 1 now, 0 later), "bad" ones continued (0 now, 1 later)
    eps = [Episode(f"g{i}", (1, 2), (f"good evidence {i}", f"noise {i}"), (1.0, 0.0)) for i in range(6)]
    eps += [Episode(f"b{i}", (1, 2), (f"bad {i}", f"answer found {i}"), (0.0, 1.0)) for i in range(6)]
    texts, samples = training_samples(eps)
    cfg = StopRagConfig(
        num_workers=2,
        cpus_per_worker=1,
        epochs=6,
        batch_size=4,
        learning_rate=5e-3,
        warmup_ratio=0.0,
        max_length=16,
        dropout=0.0,
    )
    folder, history = train_qnetwork(
        texts, samples, cfg, tiny_encoder, tmp_path / "qnet", seed=0, meta={"threshold": 0.1}
    )
    assert len(history) == 6 and history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["lambda"] == pytest.approx(0.1)  # annealed to the end value
    assert folder == tmp_path / "qnet" and not (tmp_path / "ray_train" / "stoprag").exists()  # checkpoints removed
    net, meta = QNetwork.load(folder)
    assert meta["threshold"] == 0.1 and meta["max_length"] == 16
    s, c = score(net, load_tokenizer(folder), ["good evidence 0", "bad 0"], 16)
    assert s[0] - c[0] > s[1] - c[1]  # the margin ranks the stop state above the continue state


def test_online_controller_pickles_light_and_decides(tiny_encoder, tmp_path):
    import asyncio
    import pickle

    from raypipe.stoprag.qnet import StopRagController, controller_from_path

    net = QNetwork(tiny_encoder, dropout=0.0)
    tok = load_tokenizer(tiny_encoder)
    meta = {
        "max_length": 32,
        "state_input": "docs",
        "doc_chars": None,
        "docs_per_iteration": 1,
        "state_truncation": "newest",
        "first_decision": 1,
    }
    net.save(tmp_path / "old", tok, extra={k: v for k, v in meta.items() if k != "docs_per_iteration"})
    with pytest.raises(ValueError, match="lacks the state settings"):
        StopRagController(tmp_path / "old", threshold=0.0)
    net.save(tmp_path / "q", tok, extra=meta)
    with pytest.raises(ValueError, match="no tuned threshold"):
        StopRagController(tmp_path / "q")
    history = [
        {"iteration": 0, "doc_titles": [], "doc_texts": []},
        {"iteration": 1, "query": "q", "doc_ids": ["x"], "doc_titles": ["T"], "doc_texts": ["text"]},
    ]
    probe = StopRagController(tmp_path / "q", threshold=0.0)
    margin = probe.margin("Q?", history)
    assert margin == pytest.approx(
        score(net.eval(), tok, ["Q?[SEP]T: text"], 32)[0][0] - score(net, tok, ["Q?[SEP]T: text"], 32)[1][0]
    )
    below, above = StopRagController(tmp_path / "q", margin - 0.01), StopRagController(tmp_path / "q", margin + 0.01)
    assert len(pickle.dumps(below)) < 10_000  # the network is not in the pickle
    assert asyncio.run(pickle.loads(pickle.dumps(below)).decide("Q?", history)).stop
    assert not asyncio.run(above.decide("Q?", history)).stop
    assert not asyncio.run(below.decide("Q?", history[:1])).stop  # iteration 0 < first_decision
    (tmp_path / "run" / "stoprag").mkdir(parents=True)
    (tmp_path / "q").rename(tmp_path / "run" / "stoprag" / "qnet")
    assert controller_from_path(tmp_path / "run", threshold=0.5).folder == tmp_path / "run" / "stoprag" / "qnet"
    with pytest.raises(FileNotFoundError, match="jobs/stoprag.py"):
        controller_from_path(tmp_path)


def test_worker_share_deals_one_permutation_evenly():
    shares = [worker_share(5, seed=0, epoch=1, rank=r, world=2, size=4) for r in range(2)]
    assert all(len(s) == 4 for s in shares)  # every worker takes the same number of steps
    assert set(shares[0][:3]) | set(shares[1][:2]) == set(range(5)) and not set(shares[0][:3]) & set(shares[1][:2])
    assert worker_share(5, 0, 1, 0, 2, 4) == shares[0] and worker_share(5, 0, 2, 0, 2, 4) != shares[0]
