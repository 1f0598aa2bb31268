"""Cross-encoder fine-tuning on Ray Train (2 CPU workers), on a tiny dataset and a tiny BERT."""

import shutil

import numpy as np
import pytest

from raypipe.core.config import TrainConfig
from raypipe.predict import crossencoder
from raypipe.stages.train import train_crossencoders
from tests.helpers.tiny_models import tiny_bert

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_ray_train_two_models_checkpointed_with_curves(ray_local, tiny_base, tmp_path):
    texts = [
        f"question {i} [SEP] [ORIG] step [SEP] [CURR_SUBQ] q [CURR] {'good' if i % 2 else 'bad'}" for i in range(12)
    ]
    labels = [float(i % 2) for i in range(12)]
    tasks = [crossencoder.Task(f"long_distance_{t}_fold0", "long_distance", texts, labels) for t in ("p", "u")]
    cfg = TrainConfig(
        base_model=tiny_base,
        epochs=2,
        batch_size=2,
        effective_batch_size=8,
        max_tokens=32,
        num_workers=2,
        learning_rate=1e-4,
    )
    assert crossencoder.accumulation_steps(cfg) == 2
    trained = train_crossencoders(tasks, cfg, tmp_path, seed=0)
    assert set(trained) == {t.name for t in tasks}
    for model in trained.values():
        assert model.rows == 12 and model.effective_batch_size == 8
        # 12 rows / (2 workers x batch 2) = 3 micro-steps per worker and epoch -> 2 optimizer steps per epoch
        assert model.curve["epoch"].tolist() == [1, 1, 2, 2] and model.curve["step"].tolist() == [1, 2, 3, 4]
        assert np.isfinite(model.curve["loss"]).all()
        loaded = crossencoder.load_crossencoder(model.path)
        assert np.isfinite(crossencoder.predict_texts(loaded, texts[:3], 32)).all()
        assert "[ORIG]" in loaded.tokenizer.get_vocab()
    # every epoch was checkpointed through Ray Train; the last epoch of each task survives
    checkpoints = sorted(p.name for p in (tmp_path / "ray_train").glob("*/*_epoch*"))
    assert {"long_distance_p_fold0_epoch2", "long_distance_u_fold0_epoch2"} <= set(checkpoints)
    # a rerun with the same data and settings reuses the models without training, and recovers a model
    # whose copy is gone from its Ray Train checkpoint (as after an interrupted run)
    shutil.rmtree(trained["long_distance_u_fold0"].path)
    again = train_crossencoders(tasks, cfg, tmp_path, seed=0)
    for name, model in trained.items():
        assert again[name].seconds == model.seconds and (again[name].path / crossencoder.DONE).exists()
