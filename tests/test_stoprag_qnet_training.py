"""The Stop-RAG Q-network's training without Ray (one local worker): the epochs, the checkpoint, the resume."""

import pytest

torch = pytest.importorskip("torch")

from raypipe.core.config import StopRagConfig  # noqa: E402
from raypipe.core.training import LocalWorker  # noqa: E402
from raypipe.stoprag.qnet import QNetwork  # noqa: E402
from raypipe.stoprag.targets import Episode, training_samples  # noqa: E402
from raypipe.stoprag.train import HISTORY, NETWORK_DIR, TRAINER_STATE, QNetTraining, loop_config  # noqa: E402


def _config(encoder) -> dict:
    eps = [Episode(f"g{i}", (1, 2), (f"good evidence {i}", f"noise {i}"), (1.0, 0.0)) for i in range(4)]
    eps += [Episode(f"b{i}", (1, 2), (f"bad {i}", f"answer found {i}"), (0.0, 1.0)) for i in range(4)]
    texts, samples = training_samples(eps)
    cfg = StopRagConfig(
        epochs=3, batch_size=4, learning_rate=5e-3, warmup_ratio=0.0, max_length=16, dropout=0.0, cpus_per_worker=2.5
    )
    return loop_config(texts, samples, cfg, encoder, seed=0, meta={"threshold": 0.1})


def _training(config: dict) -> QNetTraining:
    torch.manual_seed(config["seed"])  # as raypipe.runtime.trainer.run_training does before building it
    return QNetTraining(config, LocalWorker())


def test_loop_config_carries_the_settings_and_the_networks_metadata(tiny_encoder):
    config = _config(tiny_encoder)
    assert config["threads"] == 2 and config["meta"] == {"max_length": 16, "threshold": 0.1}
    assert StopRagConfig.model_validate(config["stoprag"]).epochs == 3 and len(config["samples"]) == 8


def test_a_resumed_run_continues_as_the_uninterrupted_one(tiny_encoder, tmp_path):
    config = _config(tiny_encoder)
    whole = [e.metrics for e in _training(config).epochs()]
    assert [m["epoch"] for m in whole] == [0, 1, 2] and [m["step"] for m in whole] == [2, 4, 6]
    assert whole[-1]["lambda"] == pytest.approx(0.1)  # annealed to the end value

    interrupted = _training(config).epochs()
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    next(interrupted).save(checkpoint)
    assert {p.name for p in checkpoint.iterdir()} == {NETWORK_DIR, TRAINER_STATE, HISTORY}
    net, meta = QNetwork.load(checkpoint / NETWORK_DIR)
    assert meta["threshold"] == 0.1 and meta["max_length"] == 16

    resumed = _training(config)
    resumed.resume(checkpoint)
    rest = [e.metrics for e in resumed.epochs()]
    assert [m["epoch"] for m in rest] == [1, 2] and [m["step"] for m in rest] == [4, 6]
    assert [m["loss"] for m in rest] == pytest.approx([m["loss"] for m in whole[1:]], rel=1e-6)
    assert [m["epoch"] for m in resumed.history] == [0, 1, 2]
