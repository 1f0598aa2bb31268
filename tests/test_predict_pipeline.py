"""The train stage's orchestration without Ray (a stand-in trainer), the tables, and the bundle's online path."""

import numpy as np
import pandas as pd
import pytest

from raypipe.core.config import TrainConfig
from raypipe.core.models import resolve_sentence_model
from raypipe.core.schema import PREDICTIONS
from raypipe.predict import crossencoder
from raypipe.predict.bundle import PredictorBundle
from raypipe.predict.window import build_window
from raypipe.stages.train import run_train
from tests.helpers import runs

pytestmark = pytest.mark.slow  # about 1 min on 2 busy cores: a real MiniLM is loaded and run


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ce") / "model"
    crossencoder.new_crossencoder(str(resolve_sentence_model("minilm")), "intra_iteration").save(str(folder))
    (folder / crossencoder.CURVE_FILE).write_text("epoch,step,loss\n1,1,0.5\n")
    return folder


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, untrained):
    calls = []

    def fake_trainer(tasks, cfg, models_dir, seed):
        calls.append([t.name for t in tasks])
        (models_dir / "crossencoders").mkdir(parents=True)
        shared = models_dir / "crossencoders" / "untrained"
        shared.symlink_to(untrained, target_is_directory=True)
        curve = pd.DataFrame({"epoch": [1], "step": [1], "loss": [0.5]})
        return {t.name: crossencoder.TrainedModel(shared, curve, 1.0, 16, len(t.texts)) for t in tasks}

    run = runs.write_run(tmp_path_factory.mktemp("run"), n_questions=40)
    cfg = TrainConfig(
        relations=["intra_iteration"],
        folds=2,
        windows=[1, 2],
        chosen_window=2,
        bootstrap_samples=20,
        groups=["prob", "unsup+sup+prob"],
    )
    summary = run_train(run, cfg, runs.doc_lookup, trainer=fake_trainer)
    return run, cfg, summary, calls


def test_one_model_per_relation_target_fold(trained_run):
    _, _, summary, calls = trained_run
    assert len(calls) == 1 and len(calls[0]) == 1 * 2 * 2  # relations x targets x folds
    assert sorted(summary["models"]["target"].unique()) == ["p", "u"]


def test_predictions_table(trained_run):
    run, cfg, summary, _ = trained_run
    table = run.read("predictions")
    assert table.schema.equals(PREDICTIONS)
    frame = table.to_pandas()
    iterations = run.read("iterations").to_pandas()
    assert len(frame) == (iterations["iteration"] >= 1).sum() == summary["rows"]
    assert frame["iteration"].min() == 1
    assert frame[["p_hat", "u_hat"]].notna().all().all()
    assert (frame["feature_group"] == cfg.chosen_group).all() and (frame["window"] == 2).all()
    assert frame.groupby("qid")["fold"].nunique().max() == 1  # a question lives in one fold
    sup = run.read("sup_signals").to_pandas()
    assert len(sup) == len(frame) and sup["sup_p_ii"].notna().all() and sup["sup_p_at"].isna().all()
    grid = run.read("prediction_grid").to_pandas()
    assert len(grid) == len(frame) * 2 * 2  # 2 groups x 2 windows


def test_tables_written(trained_run):
    run, _, summary, _ = trained_run
    tables = run.path / "predictions" / "tables"
    for name in ("table3_signal_groups", "table4_unsup_sources", "crossencoders"):
        assert (tables / f"{name}.csv").exists() and (tables / f"{name}.md").exists()
    t3 = pd.read_csv(tables / "table3_signal_groups.csv")
    assert set(t3["group"]) == {"prob", "unsup+sup+prob"} and set(t3["window"]) == {1, 2}
    assert t3.loc[t3["window"] == 1, "fisher_p"].isna().all() and t3.loc[t3["window"] == 2, "fisher_p"].notna().all()
    prob_p = t3[(t3["group"] == "prob") & (t3["target"] == "p") & (t3["window"] == 1)].iloc[0]
    assert prob_p["pearson"] > 0.5  # the planted signal is found
    assert set(pd.read_csv(tables / "table4_unsup_sources.csv")["source"]) == {"intra", "inter", "alignment", "all"}
    assert "| prob |" in (tables / "table3_signal_groups.md").read_text()
    assert (tables / "crossencoder_curves.png").stat().st_size > 1000


def test_bundle_online_equals_offline(trained_run):
    run, cfg, _, _ = trained_run
    bundle = PredictorBundle.load(run.path / "models", doc_lookup=runs.doc_lookup)
    assert bundle.window == 2 and bundle.feature_group == "unsup+sup+prob"
    iterations = run.read("iterations").to_pandas()
    features = run.read("features").to_pandas()
    question = run.read("trajectories").to_pandas().set_index("qid")["question"]
    qid = iterations.groupby("qid")["iteration"].max().idxmax()
    history = iterations[iterations["qid"] == qid].merge(
        features.drop(columns=["dataset", "probe_f1", "utility"]), on=["qid", "iteration"]
    )
    rows = [{k: v for k, v in r.items() if k not in ("probe_f1", "utility")} for r in history.to_dict("records")]
    p_hat, u_hat = bundle.predict(rows, question[qid])
    # offline: the same features through the window builder and the saved heads
    frame = bundle.feature_frame(rows, question[qid])
    x, _ = build_window(frame, bundle.feature_columns, bundle.window, **bundle.manifest["window_options"])
    assert p_hat == pytest.approx(float(bundle.heads["p"].predict(x[-1:])[0]))
    assert np.isfinite([p_hat, u_hat]).all()
    with pytest.raises(ValueError, match="iteration 1"):
        bundle.predict(rows[:1], question[qid])
    bare = [{k: v for k, v in r.items() if k not in bundle.feature_columns} for r in rows]
    with pytest.raises(ValueError, match="feature_extractor"):
        bundle.predict(bare, question[qid])
