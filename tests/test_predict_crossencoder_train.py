"""The cross-encoders' fine-tuning without Ray (one local worker): the curve, the checkpoints, the resume."""

import pytest

torch = pytest.importorskip("torch")

from raypipe.core.config import TrainConfig  # noqa: E402
from raypipe.core.training import LocalWorker  # noqa: E402
from raypipe.predict import crossencoder  # noqa: E402
from raypipe.predict.crossencoder_train import FINAL_SCORE, CrossEncoderTraining  # noqa: E402
from tests.helpers.tiny_models import tiny_bert  # noqa: E402

TEXTS = [f"question {i} [SEP] [ORIG] step [SEP] [CURR_SUBQ] q [CURR] {'good' if i % 2 else 'bad'}" for i in range(10)]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _config(base: str) -> tuple[dict, TrainConfig]:
    cfg = TrainConfig(
        base_model=base,
        epochs=2,
        batch_size=2,
        effective_batch_size=4,
        max_tokens=32,
        num_workers=1,
        learning_rate=1e-4,
    )
    tasks = [
        crossencoder.Task(
            f"long_distance_{t}_fold0", "long_distance", TEXTS, [float(i % 2) for i in range(10)], key=f"key-{t}"
        )
        for t in ("p", "u")
    ]
    return crossencoder.loop_config(tasks, cfg, seed=0), cfg


def test_every_task_trains_epoch_by_epoch_with_a_checkpoint_each(tiny_base, tmp_path):
    config, cfg = _config(tiny_base)
    assert config["accum"] == 2
    ends = list(CrossEncoderTraining(config, LocalWorker()).epochs())
    assert [e.name for e in ends] == [
        "long_distance_p_fold0_epoch1",
        "long_distance_p_fold0_epoch2",
        "long_distance_u_fold0_epoch1",
        "long_distance_u_fold0_epoch2",
    ]
    assert [(e.metrics["epoch"], e.metrics["final"], e.metrics["keep_score"]) for e in ends] == [
        (1, False, 0),
        (2, True, FINAL_SCORE),
        (1, False, 1),
        (2, True, FINAL_SCORE + 1),
    ]
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    ends[1].save(folder)
    model = crossencoder.load_trained(folder, cfg)
    # 10 rows in batches of 2 = 5 micro-batches per epoch; a step every 2 and one at the epoch's end -> 3 steps
    assert model.curve["epoch"].tolist() == [1, 1, 1, 2, 2, 2] and model.curve["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert model.rows == 10 and model.effective_batch_size == 4
    assert ends[1].metrics["train_loss"] == pytest.approx(model.curve["loss"].tail(3).mean())
    assert "[ORIG]" in crossencoder.load_crossencoder(folder).tokenizer.get_vocab()


def test_same_seed_same_model(tiny_base, tmp_path):
    config, _ = _config(tiny_base)
    config["tasks"] = config["tasks"][:1]
    weights = []
    for run in ("a", "b"):
        end = list(CrossEncoderTraining(config, LocalWorker()).epochs())[-1]
        (tmp_path / run).mkdir()
        end.save(tmp_path / run)
        weights.append(crossencoder.load_crossencoder(tmp_path / run).model.state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_resume_starts_after_the_last_finished_task_or_again_at_a_cut_one(tiny_base, tmp_path):
    config, _ = _config(tiny_base)
    first = CrossEncoderTraining(config, LocalWorker()).epochs()
    for name, end in (("cut", next(first)), ("finished", next(first))):
        (tmp_path / name).mkdir()
        end.save(tmp_path / name)
    for name, expected in (
        ("finished", ["long_distance_u_fold0_epoch1", "long_distance_u_fold0_epoch2"]),
        (
            "cut",
            [
                "long_distance_p_fold0_epoch1",
                "long_distance_p_fold0_epoch2",
                "long_distance_u_fold0_epoch1",
                "long_distance_u_fold0_epoch2",
            ],
        ),
    ):
        resumed = CrossEncoderTraining(config, LocalWorker())
        resumed.resume(tmp_path / name)
        assert [e.name for e in resumed.epochs()] == expected
