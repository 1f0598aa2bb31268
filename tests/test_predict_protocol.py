"""The paper's protocol: train on a training run, evaluate on the target run (jobs/train.py --train-run)."""

import pandas as pd
import pytest

from raypipe.core.config import TrainConfig
from raypipe.predict import crossencoder
from raypipe.predict.splits import check_disjoint, protocol_note
from raypipe.stages.train import run_train
from tests.helpers import runs
from tests.helpers.tiny_models import tiny_bert


def test_overlapping_runs_fail_naming_the_questions():
    check_disjoint(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"2 questions are in both the training run and this run: b, c"):
        check_disjoint(["a", "b", "c"], ["b", "c", "d"])
    assert "cross-fitting" in protocol_note(None, 5) and "trained on the run /x" in protocol_note("/x")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Paper §5.3 (FIDELITY.md, evaluation protocol): predictors trained on the training splits,
    evaluated on dev, no cross-validation on dev."""
    base = tiny_bert(tmp_path_factory.mktemp("tiny"))
    folder = tmp_path_factory.mktemp("ce") / "model"
    crossencoder.new_crossencoder(base, "intra_iteration").save(str(folder))
    calls = []

    def fake_trainer(tasks, cfg, models_dir, seed):
        calls.extend(tasks)
        shared = models_dir / "crossencoders" / "untrained"
        shared.parent.mkdir(parents=True)
        shared.symlink_to(folder, target_is_directory=True)
        curve = pd.DataFrame({"epoch": [1], "step": [1], "loss": [0.5]})
        return {t.name: crossencoder.TrainedModel(shared, curve, 1.0, 16, len(t.texts)) for t in tasks}

    train_run = runs.write_run(tmp_path_factory.mktemp("train"), n_questions=40, seed=1, prefix="t")
    target = runs.write_run(tmp_path_factory.mktemp("dev"), n_questions=20, seed=2, prefix="d")
    cfg = TrainConfig(
        relations=["intra_iteration"],
        windows=[1, 2],
        chosen_window=2,
        bootstrap_samples=20,
        groups=["prob", "unsup+sup+prob"],
        ablation_windows=[1],
        head_max_iter=100,
    )
    types = {f"t{i}": ("bridge", "comparison")[i % 2] for i in range(40)} | {f"d{i}": "bridge" for i in range(20)}
    summary = run_train(target, cfg, runs.doc_lookup, trainer=fake_trainer, train_run=train_run, question_types=types)
    return train_run, target, summary, calls


def _rows(run):
    its = run.read("iterations").to_pandas()
    return its[its["iteration"] >= 1]


@pytest.mark.slow  # the fixture: about 17 s on 2 busy cores
def test_models_train_on_the_training_run_only(trained):
    train_run, target, summary, calls = trained
    assert sorted(t.name for t in calls) == ["intra_iteration_p_foldtrain", "intra_iteration_u_foldtrain"]
    assert all(len(t.texts) == len(_rows(train_run)) for t in calls)  # every training row, no target row
    assert summary["train_questions"] == 40 and summary["questions"] == 20


@pytest.mark.slow
def test_evaluation_on_the_target_run_only(trained):
    train_run, target, summary, _ = trained
    predictions = target.read("predictions").to_pandas()
    assert set(predictions["qid"]) == set(_rows(target)["qid"]) and len(predictions) == len(_rows(target))
    assert (predictions["fold"] == 0).all() and predictions[["p_hat", "u_hat"]].notna().all().all()
    t3 = pd.read_csv(target.path / "predictions" / "tables" / "table3_signal_groups.csv")
    assert (t3["n"] == len(_rows(target))).all()
    assert t3["protocol"].str.contains(f"trained on the run {train_run.path}", regex=False).all()
    assert (
        f"trained on the run {train_run.path}"
        in (target.path / "predictions/tables/table3_signal_groups.md").read_text()
    )
    assert len(target.read("sup_signals")) == len(_rows(target))


def test_overlapping_training_run_is_refused(tmp_path):
    a = runs.write_run(tmp_path / "a", n_questions=12, prefix="q")
    b = runs.write_run(tmp_path / "b", n_questions=12, seed=3, prefix="q")
    with pytest.raises(ValueError, match="12 questions are in both .* q0, q1, q10"):
        run_train(b, TrainConfig(), runs.doc_lookup, trainer=lambda *a: {}, train_run=a)
