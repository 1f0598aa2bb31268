"""The sweep: grid evaluation, selection on validation, Pareto front, and a small Tune run end to end."""

import json
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from raypipe.core.config import HeadRefit, StoppingConfig, TrainConfig
from raypipe.core.schema import PREDICTIONS
from raypipe.stopping.grid import (
    SUMS,
    aggregate,
    baseline_rows,
    beats_paper,
    choose_thresholds,
    controller_rows,
    cross_fit,
    evaluate_grid,
    pareto_front,
    predictions_by_head,
    score_choice,
    select,
    threshold_grid,
)
from raypipe.stopping.heuristic import VARIANTS, Thresholds, replay_controller
from raypipe.stopping.replay import Trajectory


def synthetic(n_questions=60, seed=0, noise=0.1):
    """Trajectories whose P_i rise then may fall, predictions = truth + noise (qid -> iteration -> (P̂, Û))."""
    rng = random.Random(seed)
    trajs, preds = [], {}
    for k in range(n_questions):
        qid, n = f"q{k}", rng.randint(1, 4)
        ps = [0.0]
        for _ in range(n):
            ps.append(min(1.0, max(0.0, ps[-1] + rng.choice([-0.3, 0.0, 0.2, 0.5]))))
        trajs.append(
            Trajectory(qid, ["hotpotqa", "musique"][k % 2], tuple(ps), tuple([10] * (n + 1)), ps[-1], 10 * (n + 1))
        )
        preds[qid] = {
            i: (ps[i] + rng.uniform(-noise, noise), ps[i] - ps[i - 1] + rng.uniform(-noise, noise))
            for i in range(1, n + 1)
        }
    return trajs, preds


def test_predictions_by_head_groups_and_validates():
    rows = [
        {
            "qid": "a",
            "dataset": "d",
            "iteration": 1,
            "fold": 0,
            "feature_group": "g",
            "window": 1,
            "p_hat": 0.5,
            "u_hat": 0.1,
            "probe_f1": 0.5,
            "utility": 0.1,
        },
        {
            "qid": "a",
            "dataset": "d",
            "iteration": 1,
            "fold": 0,
            "feature_group": "g",
            "window": 3,
            "p_hat": 0.25,
            "u_hat": -0.5,
            "probe_f1": 0.5,
            "utility": 0.1,
        },
    ]
    heads = predictions_by_head(pa.Table.from_pylist(rows, schema=PREDICTIONS))
    assert heads == {("g", 1): {"a": {1: (0.5, pytest.approx(0.1))}}, ("g", 3): {"a": {1: (0.25, -0.5)}}}
    with pytest.raises(ValueError, match="duplicate"):
        predictions_by_head(pa.Table.from_pylist([rows[0], rows[0]], schema=PREDICTIONS))
    with pytest.raises(ValueError, match="missing p_hat"):
        predictions_by_head(pa.Table.from_pylist([{**rows[0], "p_hat": None}], schema=PREDICTIONS))


def test_threshold_grid_adds_quantiles():
    assert threshold_grid([0.0, 0.5], [], 3) == [0.0, 0.5]
    grid = threshold_grid([0.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5], 3)
    assert grid == [0.0, 0.2, 0.3, 0.4, 1.0]


def test_grid_sums_match_a_direct_replay_and_natural():
    trajs, preds = synthetic(20)
    split_of = {t.qid: ("val" if i % 2 else "test") for i, t in enumerate(trajs)}
    grid = evaluate_grid(trajs, preds, ["paper"], [0.3, 2.0], [0.2], split_of)
    assert set(grid["split"]) == {"val", "test"} and set(grid["dataset"]) == {"hotpotqa", "musique"}
    assert grid.groupby(["theta_p", "theta_u"])["n"].sum().tolist() == [20, 20]
    # θ_P above every prediction: nothing is ever high quality, so it is natural stopping
    never = aggregate(grid[grid["theta_p"] == 2.0], ["theta_p"]).iloc[0]
    nat = aggregate(pd.DataFrame(baseline_rows(trajs, split_of)).query("controller == 'natural'"), ["controller"]).iloc[
        0
    ]
    assert never["mean_iterations"] == pytest.approx(nat["mean_iterations"])
    assert (never["f1_share"], never["iterations_change"]) == (pytest.approx(1.0), pytest.approx(0.0))
    stopped = aggregate(grid[grid["theta_p"] == 0.3], ["theta_p"]).iloc[0]
    assert stopped["mean_iterations"] < never["mean_iterations"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_grid_equals_replaying_each_threshold_pair(variant):
    trajs, preds = synthetic(30, seed=3)
    split_of = {t.qid: ("val" if i % 3 else "test") for i, t in enumerate(trajs)}
    tps, tus = [0.0, 0.15, 0.3, 0.45, 0.7, 1.1], [-0.35, -0.1, 0.0, 0.1, 0.25, 0.6]
    grid = evaluate_grid(trajs, preds, [variant], tps, tus, split_of)
    cols = ["split", "dataset", "n", *SUMS]
    for tp in tps:
        for tu in tus:
            ctl = replay_controller(preds, Thresholds(tp, tu), VARIANTS[variant])
            direct = pd.DataFrame(controller_rows(trajs, ctl, split_of)).sort_values(["split", "dataset"])
            got = grid[(grid["theta_p"] == tp) & (grid["theta_u"] == tu)].sort_values(["split", "dataset"])
            pd.testing.assert_frame_equal(
                got[cols].reset_index(drop=True), direct[cols].reset_index(drop=True), check_dtype=False
            )


def test_baselines_cover_every_cap():
    trajs, _ = synthetic(20)
    rows = pd.DataFrame(baseline_rows(trajs, {t.qid: "test" for t in trajs}))
    longest = max(t.n_iterations for t in trajs)
    assert set(rows["controller"]) == {"natural", *(f"cap@{k}" for k in range(1, longest + 1))}
    at_max = aggregate(rows[rows["controller"] == f"cap@{longest}"], ["controller"]).iloc[0]
    assert at_max["iterations_change"] == 0.0


def _points(rows):
    return pd.DataFrame(rows).assign(n=1)


def test_select_rule():
    pts = pd.DataFrame(
        {
            "theta_p": [0.1, 0.2, 0.3, 0.4],
            "theta_u": [0.0] * 4,
            "mean_iterations": [1.0, 1.5, 1.5, 3.0],
            "mean_f1": [0.3, 0.49, 0.5, 0.5],
            "f1_share": [0.6, 0.98, 1.0, 1.0],
        }
    )
    # fewest iterations among shares >= 0.976; the tie at 1.5 goes to the higher F1
    assert select(pts, 0.976)["theta_p"] == 0.3
    assert select(pts, 0.5)["theta_p"] == 0.1
    # nothing qualifies: the highest share, then the fewest iterations
    assert select(pts, 1.1)["theta_p"] == 0.3
    with pytest.raises(ValueError):
        select(pts.iloc[:0], 0.9)


def test_choose_on_validation_score_on_test_and_per_dataset():
    trajs, preds = synthetic(80, seed=1)
    split_of = {t.qid: ("val" if (i // 2) % 2 else "test") for i, t in enumerate(trajs)}
    grid = evaluate_grid(trajs, preds, ["paper"], [0.2, 0.4, 0.6, 2.0], [-0.1, 0.1, 0.3], split_of)
    chosen = choose_thresholds(grid, 0.95)
    val = score_choice(grid, chosen, "val")
    assert val["f1_share"] >= 0.95
    # the choice is the fewest validation iterations among admissible points
    pts = aggregate(grid[grid["split"] == "val"], ["theta_p", "theta_u"])
    assert val["mean_iterations"] == pytest.approx(pts[pts["f1_share"] >= 0.95]["mean_iterations"].min())
    test = score_choice(grid, chosen, "test")
    assert test["n"] == 40
    per = choose_thresholds(grid, 0.95, per_dataset=True)
    assert set(per) == {"*", "hotpotqa", "musique"} and per["*"] == chosen["*"]
    assert score_choice(grid, per, "test")["n"] == 40
    for ds in ("hotpotqa", "musique"):
        alone = choose_thresholds(grid[grid["dataset"] == ds], 0.95)["*"]
        assert per[ds] == alone
    with pytest.raises(ValueError, match="no thresholds chosen for dataset 'musique'"):
        score_choice(grid, {"hotpotqa": per["hotpotqa"]}, "test")


def test_cross_fit_scores_each_half_with_the_other_halfs_choice():
    trajs, preds = synthetic(80, seed=2)
    split_of = {t.qid: ("val" if (i // 2) % 2 else "test") for i, t in enumerate(trajs)}
    grid = evaluate_grid(trajs, preds, ["paper"], [0.2, 0.4, 0.6, 2.0], [-0.1, 0.1, 0.3], split_of)
    both = cross_fit(grid, 0.95)
    assert both["n"] == 80
    on_test = score_choice(grid, choose_thresholds(grid, 0.95), "test")
    on_val = score_choice(grid, choose_thresholds(grid, 0.95, split="test"), "val")
    assert both["iterations"] == on_test["iterations"] + on_val["iterations"]
    assert both["f1_share"] == pytest.approx(
        (on_test["f1"] + on_val["f1"]) / (on_test["natural_f1"] + on_val["natural_f1"])
    )


def test_pareto_front():
    pts = pd.DataFrame({"mean_iterations": [1, 2, 2, 3, 4], "mean_f1": [0.2, 0.5, 0.4, 0.45, 0.6]})
    front = pareto_front(pts)
    assert list(zip(front["mean_iterations"], front["mean_f1"])) == [(1, 0.2), (2, 0.5), (4, 0.6)]


def test_beats_paper():
    assert beats_paper(-0.15, 0.98)
    assert not beats_paper(-0.10, 0.99)
    assert not beats_paper(-0.20, 0.97)


# ---------------------------------------------------------------- end to end on Ray Tune


def write_synthetic_run(path, n_questions=40, seed=0, prefix="q"):
    """The predictors' synthetic run (iterations, trajectories, features with planted signal) plus
    predictions and a two-window prediction_grid (truth + noise)."""
    from tests.helpers.runs import write_run

    run = write_run(path, n_questions=n_questions, seed=seed, prefix=prefix)
    rng = random.Random(seed)
    rows = []
    for r in run.read("iterations").to_pylist():
        if r["iteration"] == 0:
            continue
        for window, shift in ((1, 0.0), (3, 0.05)):
            rows.append(
                {
                    "qid": r["qid"],
                    "dataset": r["dataset"],
                    "iteration": r["iteration"],
                    "fold": 0,
                    "feature_group": "unsup+sup",
                    "window": window,
                    "p_hat": r["probe_f1"] + rng.uniform(-0.1, 0.1) + shift,
                    "u_hat": r["utility"] + rng.uniform(-0.1, 0.1),
                    "probe_f1": r["probe_f1"],
                    "utility": r["utility"],
                }
            )
    grid = pa.Table.from_pylist(rows, schema=PREDICTIONS)
    run.write_part("prediction_grid", grid, "part-0")
    run.write_part("predictions", grid.filter(pa.compute.equal(grid["window"], 1)), "part-0")
    return run


def test_load_heads(tmp_path):
    from raypipe.stopping.inputs import load_heads

    run = write_synthetic_run(tmp_path / "run", n_questions=6)
    chosen, heads = load_heads(run, "chosen")
    assert chosen == ("unsup+sup", 1) and list(heads) == [chosen]
    _, heads = load_heads(run, "windows")
    assert sorted(heads) == [("unsup+sup", 1), ("unsup+sup", 3)]
    assert heads[("unsup+sup", 3)]["q0"][1][0] != heads[("unsup+sup", 1)]["q0"][1][0]


def test_refit_predictions_use_the_predictors_head(tmp_path):
    from raypipe.core.config import HeadRefit, TrainConfig
    from raypipe.stopping.refit import head_frame, refit_label, refit_predictions, resolve

    run = write_synthetic_run(tmp_path / "run", n_questions=60)
    frame = head_frame(run)
    train = TrainConfig(folds=3, chosen_group="prob", chosen_window=1)  # the seed's 300 epochs: one batch each here
    refit = resolve(HeadRefit(head_hidden=[8]), train)
    assert (refit.group, refit.window) == ("prob", 1)
    assert resolve(HeadRefit(group="unsup", window=3), train).model_dump(include={"group", "window"}) == {
        "group": "unsup",
        "window": 3,
    }
    preds = refit_predictions(frame, refit, train)
    truth = {(r.qid, r.iteration): r.probe_f1 for r in frame.itertuples()}
    assert {(q, i) for q, its in preds.items() for i in its} == set(truth)
    pairs = [(preds[q][i][0], f1) for (q, i), f1 in truth.items()]
    r = np.corrcoef([a for a, _ in pairs], [b for _, b in pairs])[0, 1]
    assert r > 0.5  # the planted probe-confidence signal is found out of fold
    assert refit_label(refit) == "prob[refit h=8 wd=0.001 lr=0.001]"
    with pytest.raises(ValueError, match="the run has no signals"):
        refit_predictions(frame, resolve(HeadRefit(group="unsup+sup"), train), train)  # no sup_signals/ here
    # a Tune trial's head: from prediction_grid, or refit
    from raypipe.stopping.refit import trial_head

    payload = {
        "predictions": {("g", 3): {"q0": {1: (0.1, 0.2)}}},
        "refits": [refit],
        "refit_frame": frame,
        "train": train,
        "seed": 0,
        "train_qids": None,
    }
    assert trial_head(["grid", "g", 3], payload) == (("g", 3), {"q0": {1: (0.1, 0.2)}})
    key, again = trial_head(["refit", 0], payload)
    assert key == ("prob[refit h=8 wd=0.001 lr=0.001]", 1) and again == preds


def test_head_frame_joins_persisted_cross_encoder_signals(tmp_path):
    from raypipe.core.schema import SUP_COLUMNS, conform
    from raypipe.stopping.refit import head_frame

    run = write_synthetic_run(tmp_path / "run", n_questions=6)
    rows = [
        {
            "qid": r["qid"],
            "dataset": r["dataset"],
            "iteration": r["iteration"],
            "fold": 0,
            **dict.fromkeys(SUP_COLUMNS, 0.5),
        }
        for r in run.read("iterations").to_pylist()
        if r["iteration"] >= 1
    ]
    run.write_part("sup_signals", conform(rows, "sup_signals"), "part-0")
    frame = head_frame(run)
    assert set(SUP_COLUMNS) <= set(frame.columns) and "probe_conf" in frame.columns
    assert (frame["sup_p_at"] == 0.5).all() and (frame["iteration"] >= 1).all()


def test_job_fails_early_on_a_run_without_predictions(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    run = write_synthetic_run(tmp_path / "run", n_questions=4)
    for part in (tmp_path / "run" / "predictions").glob("*.parquet"):
        part.unlink()
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "jobs" / "sweep.py"), str(run.path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        timeout=120,
    )
    assert proc.returncode != 0
    assert "no predictions table here; run jobs/train.py" in proc.stderr


@pytest.mark.slow
def test_sweep_stage_on_tune(tmp_path, ray_local, monkeypatch):
    import raypipe.stages.sweep as sweep_stage
    from raypipe.analysis.tracking import StageTracker
    from raypipe.core.config import ReportConfig, TrackingConfig
    from raypipe.runtime.stage_main import tune_callbacks
    from raypipe.stopping.refit import head_frame, refit_predictions, resolve

    run = write_synthetic_run(tmp_path / "run")
    cfg = StoppingConfig(
        theta_p_grid=[0.0, 0.3, 0.6, 2.0],
        theta_u_grid=[-0.1, 0.2],
        quantile_points=1,
        variants=["paper", "delta_p"],
        heads="chosen",
        refits=[HeadRefit(group="prob", window=1, head_hidden=[8]), HeadRefit(group="unsup+sup")],
    )
    tested_heads = {}
    paired_tests = sweep_stage.sweep_pvalues

    def keep_heads(out, table, inputs, heads, thresholds, options):
        tested_heads.update(heads)
        return paired_tests(out, table, inputs, heads, thresholds, options)

    monkeypatch.setattr(sweep_stage, "sweep_pvalues", keep_heads)
    tracker = StageTracker.open(TrackingConfig(mlflow_uri=str(tmp_path / "mlruns")), run.path, "sweep")
    train = TrainConfig(folds=3, head_max_iter=60)
    report = sweep_stage.run_sweep(
        run,
        cfg,
        experiment="t",
        train=train,
        options=ReportConfig(bootstrap_samples=100),
        callbacks=tune_callbacks(tracker),
    )
    out = tmp_path / "run" / "stopping"
    for name in (
        "01_tradeoff.md",
        "01_tradeoff.csv",
        "02_figure5.png",
        "selected.json",
        "data/grid.parquet",
        "data/selections.csv",
        "data/pareto.csv",
    ):
        assert (out / name).exists(), name
    grid = pd.read_parquet(out / "data" / "grid.parquet")
    assert set(zip(grid["feature_group"], grid["window"])) == {
        ("unsup+sup", 1),
        ("prob[refit h=8 wd=0.001 lr=0.001]", 1),
    }
    assert set(grid["variant"]) == {"paper", "delta_p"}
    # TensorBoard event files from Tune, one per trial
    assert len(list((out / "tune" / "t").glob("*/events.out.tfevents.*"))) == 2
    table = report.table
    assert "natural" in set(table["controller"]) and "cap@1" in set(table["controller"])
    natural = table[table["controller"] == "natural"].iloc[0]
    assert natural["f1_share"] == pytest.approx(1.0)
    selected = json.loads((out / "selected.json").read_text())
    assert selected["paper"]["thresholds"] == {"*": {"theta_p": 0.3, "theta_u": 0.2}}
    assert selected["faithful"]["variant"] == "paper"
    assert selected["questions"]["val"] + selected["questions"]["test"] == 40
    assert len(selections := pd.read_csv(out / "data" / "selections.csv")) > len(table) - 5
    assert "prob[refit h=8 wd=0.001 lr=0.001]" in set(selections["feature_group"])
    md = (out / "01_tradeoff.md").read_text()
    assert md.startswith("# Early stopping") and "| natural |" in md and "The paper's operating point is -10.89%" in md
    # paired tests against natural stopping: the refit head's predictions came back from its trial
    refit_key = ("prob[refit h=8 wd=0.001 lr=0.001]", 1)
    refit = resolve(HeadRefit(group="prob", window=1, head_hidden=[8]), train)
    again = refit_predictions(head_frame(run), refit, train)
    returned = tested_heads[refit_key]
    assert {(q, i) for q in returned for i in returned[q]} == {(q, i) for q in again for i in again[q]}
    assert all(returned[q][i] == pytest.approx(again[q][i], abs=1e-5) for q in again for i in again[q])
    assert "| F1 p (t / signed-rank) | EM p (McNemar) | iterations p (signed-rank) |" in md and "Holm-corrected" in md
    significance = pd.read_csv(out / "03_significance.csv")
    assert len(significance) == 4 * (len(table) - 1) and "natural" not in set(significance["system"])
    assert pd.read_csv(out / "01_tradeoff.csv")["f1_test_p_adj"].notna().sum() == len(table) - 1
    # Tune's MLflow callback: one MLflow run per trial in the run directory's experiment
    import mlflow

    client = mlflow.MlflowClient((tmp_path / "mlruns").as_uri())
    trials = client.search_runs(
        [client.get_experiment_by_name("run").experiment_id], "tags.`raypipe.stage` = 'sweep-trial'"
    )
    assert len(trials) == 2 and all("test_f1_share" in t.data.metrics for t in trials)


def test_train_run_chooses_on_the_training_run_and_reports_on_the_target(tmp_path):
    """Paper protocol (FIDELITY.md, evaluation protocol): thresholds are chosen on the training run's
    questions (the validation split) and reported on every question of the target run (test)."""
    from raypipe.core.config import StoppingConfig
    from raypipe.stopping.inputs import load_inputs

    train_run = write_synthetic_run(tmp_path / "train", n_questions=12, seed=1, prefix="t")
    target = write_synthetic_run(tmp_path / "dev", n_questions=8, seed=2, prefix="d")
    cfg = StoppingConfig(refits=[])
    inputs = load_inputs(target, cfg, None, train_run)
    assert {q for q, s in inputs.split_of.items() if s == "val"} == {f"t{i}" for i in range(12)}
    assert {q for q, s in inputs.split_of.items() if s == "test"} == {f"d{i}" for i in range(8)}
    assert inputs.questions == {"val": 12, "test": 8} and inputs.train_qids == {f"t{i}" for i in range(12)}
    assert "chosen on the training run" in inputs.protocol
    assert set(inputs.chosen) == {f"t{i}" for i in range(12)} | {f"d{i}" for i in range(8)}
    single = load_inputs(target, cfg, None)
    assert single.train_qids is None and "cross-fitting" in single.protocol
    overlapping = write_synthetic_run(tmp_path / "other", n_questions=4, seed=3, prefix="d")
    with pytest.raises(ValueError, match="4 questions are in both .*d0, d1, d2, d3"):
        load_inputs(target, cfg, None, overlapping)


def test_train_run_refits_never_train_on_the_target(tmp_path):
    from raypipe.core.config import HeadRefit, TrainConfig
    from raypipe.stopping.refit import head_frame, refit_predictions, resolve

    train_run = write_synthetic_run(tmp_path / "train", n_questions=30, seed=1, prefix="t")
    target = write_synthetic_run(tmp_path / "dev", n_questions=10, seed=2, prefix="d")
    frame = pd.concat([head_frame(train_run), head_frame(target)], ignore_index=True)
    train = TrainConfig(folds=3, chosen_group="prob", chosen_window=1, head_max_iter=50)
    refit = resolve(HeadRefit(head_hidden=[8]), train)
    qids = {f"t{i}" for i in range(30)}
    preds = refit_predictions(frame, refit, train, train_qids=qids)
    changed = frame.copy()
    changed.loc[~changed["qid"].isin(qids), ["probe_f1", "utility"]] = 0.0  # the target run's targets
    assert refit_predictions(changed, refit, train, train_qids=qids) == preds


def test_an_old_runs_head_refits_load_with_the_renamed_regulariser(tmp_path):
    """A run written before the seed head: its refits carry head_alpha (sklearn's L2 term), read now as the
    head_weight_decay equivalent to it at the run's batch size (tests/test_jobargs.py: the values)."""
    import yaml

    from raypipe.core.config import dump_config, load_config
    from raypipe.core.jobargs import job_parser, run_config_from_args

    dump_config(load_config(), tmp_path / "config.yaml")
    tree = yaml.safe_load((tmp_path / "config.yaml").read_text())
    tree["stopping"]["refits"] = [
        {"group": None, "window": None, "head_hidden": [32, 16], "head_alpha": 0.01, "head_learning_rate": 0.001}
    ]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    config = run_config_from_args(job_parser("test").parse_args([]), tmp_path)
    [refit] = config.stopping.refits
    assert (refit.head_hidden, refit.head_weight_decay) == ([32, 16], 2 * 0.01 / 256)  # not 0.01: Adam's decay
