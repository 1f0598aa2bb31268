"""The train job: its driver, its Ray adapters and its entry point (``raypipe train``, ``python jobs/train.py``).

The steps are Ray-free, in :mod:`raypipe.predict` (``pipeline``: signals, head grid, tables, bundle;
``crossencoder``: the model, task keys, reuse; ``crossencoder_train``: the fine-tuning epochs and their
checkpoints). Here they get Ray: the cross-encoders are fine-tuned on Ray Train by data-parallel workers
(DDP; gloo on CPUs, NCCL on GPUs), the worker loop wired by :func:`raypipe.runtime.trainer.run_training`;
the head grid's cells run as Ray tasks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from raypipe.analysis.headlines import train_headline
from raypipe.core.config import TrainConfig
from raypipe.core.rundir import RunDir
from raypipe.predict import groups
from raypipe.predict.crossencoder import TRAIN_STORAGE, Task, TrainedModel, install_model, loop_config, plan_training
from raypipe.predict.crossencoder_train import CrossEncoderTraining
from raypipe.predict.docs import doc_lookup_for
from raypipe.predict.head import NOT_PREDICTED
from raypipe.predict.pipeline import (
    KEYS,
    CellScores,
    CellSpec,
    Trainer,
    ablation_sets,
    crossencoder_scores,
    fit_and_score,
    fit_bundle_heads,
    fit_cells,
    head_grid,
    prediction_rows,
    prediction_table,
    sup_signals_table,
    supervised_signals,
)
from raypipe.predict.qtypes import run_question_types
from raypipe.predict.relations import DocLookup, relation_frame
from raypipe.predict.runs import read_runs
from raypipe.predict.splits import assign_folds, fold_column, protocol_note
from raypipe.predict.tables import plot_curves, write_tables
from raypipe.predict.window import TYPE_COLUMN
from raypipe.runtime.stage_main import RunDirStage, StageRun, print_model_note
from raypipe.runtime.trainer import MAX_FAILURES, is_uri, run_training, storage_location, torch_trainer

DESCRIPTION = """Train the P_i / U_i predictors of a run: cross-encoders on Ray Train, the windowed head, Tables 3-4.

Reads RUN_DIR/iterations/, trajectories/ and features/ (jobs/features.py). Fine-tunes one cross-encoder
per relation x target x fold (k-fold by question) with Ray Train, fits the windowed MLP head for every
signal family x target x window out of fold, evaluates on held-out questions (Pearson r, Kendall tau,
Fisher z vs w=1, bootstrap intervals) and writes RUN_DIR/predictions/ (predictions table, tables/,
curves/), RUN_DIR/prediction_grid/ and the predictor bundle RUN_DIR/models/ (docs/predictors.md).
The run's own config.yaml is the base configuration unless --config names another; settings: train.*.
"""

log = logging.getLogger(__name__)


def train_loop_per_worker(config: dict) -> None:
    """The Ray Train worker loop: every task of ``config`` (:func:`loop_config`) fine-tuned in turn."""
    run_training(partial(CrossEncoderTraining, config), seed=config["seed"], threads=config["threads"])


def train_crossencoders(
    tasks: list[Task],
    cfg: TrainConfig,
    models_dir: Path,
    seed: int = 0,
    max_failures: int = MAX_FAILURES,
    storage: str | None = None,
) -> dict[str, TrainedModel]:
    """Fine-tune every task in one TorchTrainer run; each last-epoch model lands in ``model_dir(task)``.
    Ray Train's runs go to ``storage`` (a path or URI, :func:`storage_location`; None: ``models_dir/ray_train``),
    and the models are read back from there.

    A task whose model is already complete (an earlier or interrupted run) is not trained again. When a
    worker dies (e.g. killed by the node's memory monitor), Ray Train restarts the worker group up to
    ``max_failures`` times and the workers resume after the last finished task (its checkpoint).
    """
    storage = storage or str((models_dir / TRAIN_STORAGE).resolve())
    done, todo = plan_training(tasks, cfg, models_dir, seed, None if is_uri(storage) else Path(storage))
    if not todo:
        return done
    trainer = torch_trainer(
        train_loop_per_worker,
        loop_config(todo, cfg, seed),
        name=f"crossencoders-{time.strftime('%Y%m%d-%H%M%S')}",
        storage=storage,
        num_workers=cfg.num_workers,
        use_gpu=cfg.use_gpu,
        cpus_per_worker=cfg.cpus_per_worker,
        max_failures=max_failures,
        keep=len(todo) + 1,
        score_attribute="keep_score",
    )
    started = time.monotonic()
    result = trainer.fit()
    log.info("Ray Train: %d models in %.0f s", len(todo), time.monotonic() - started)
    finals = {m["task"]: c for c, m in result.best_checkpoints if m.get("final")}
    missing = [t.name for t in todo if t.name not in finals]
    if missing:
        raise RuntimeError(f"Ray Train finished without final checkpoints for {missing}")
    for task in todo:
        with finals[task.name].as_directory() as ckpt:
            done[task.name] = install_model(task, Path(ckpt), models_dir, cfg)
    return done


def fit_cells_on_ray(
    data: pd.DataFrame, fold_of_row: np.ndarray, specs: list[CellSpec], cfg: TrainConfig, seed: int
) -> list[CellScores]:
    """The head grid's cells as Ray tasks (one CPU each) when Ray is initialised, else in this process."""
    import ray

    if not ray.is_initialized():
        return fit_cells(data, fold_of_row, specs, cfg, seed)
    remote = ray.remote(num_cpus=1)(fit_and_score)
    data_ref, folds_ref = ray.put(data), ray.put(fold_of_row)
    return ray.get([remote.remote(data_ref, folds_ref, cols, target, w, cfg, seed) for cols, target, w in specs])


def run_train(
    run: RunDir,
    cfg: TrainConfig,
    doc_lookup: DocLookup | None,
    seed: int = 0,
    trainer: Trainer | None = None,
    train_run: RunDir | None = None,
    question_types: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """The whole stage on one run directory; returns a summary (tables and timings).

    ``trainer`` fine-tunes the cross-encoders (default :func:`train_crossencoders`, on Ray Train).
    ``train_run``: train every model on that run's questions and evaluate on this run's (the paper's
    protocol, :mod:`raypipe.predict.pipeline`); None: cross-fitting within this run.
    ``question_types``: qid -> question type, for the head's type one-hot (``cfg.include_type``).
    """
    started = time.monotonic()
    iterations, trajectories, features, train_qids = read_runs(run, train_run)
    data = prediction_rows(iterations)
    if data.empty or not (~data["qid"].isin(train_qids)).any():
        raise ValueError(f"{run.path}: no retrieval iterations (iteration >= 1) to predict")
    data[TYPE_COLUMN] = data["qid"].map(dict(question_types or {}))
    questions = data[["qid", "dataset"]].drop_duplicates("qid")
    if train_run is None:
        folds = assign_folds(questions, cfg.folds, seed)
    else:  # the training run's rows are trained on only, the target's are the one held-out fold
        folds = {q: (NOT_PREDICTED if q in train_qids else 0) for q in questions["qid"]}
    fold_of_row = fold_column(data, folds)
    protocol = protocol_note(str(train_run.path) if train_run else None, cfg.folds)
    models_dir = run.path / "models"
    out_dir = run.path / "predictions"
    tables_dir = out_dir / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    log.info("%d questions, %d rows; %s", len(questions), len(data), protocol)

    texts = relation_frame(
        iterations[iterations["qid"].isin(questions["qid"])],
        trajectories,
        cfg.relations,
        doc_lookup,
        cfg.field_chars,
        cfg.title_chars,
        cfg.reasoning_text,
    )
    texts = data[KEYS].merge(
        texts.drop(columns=["dataset"]), on=["qid", "iteration"], how="left", validate="one_to_one"
    )
    train_rows = texts["qid"].isin(train_qids).to_numpy() if train_run is not None else None
    ce_folds = (
        folds
        if train_run is not None or cfg.crossencoder_folds in (None, cfg.folds)
        else assign_folds(questions, cfg.crossencoder_folds, seed)
    )
    sup = supervised_signals(texts, ce_folds, cfg, models_dir, trainer or train_crossencoders, seed, train_rows)
    ce_table = crossencoder_scores(texts, sup, cfg, None if train_rows is None else ~train_rows)
    curves_dir = out_dir / "curves"
    curves_dir.mkdir(parents=True, exist_ok=True)
    for name, curve in sup.curves.items():
        curve.to_csv(curves_dir / f"{name}.csv", index=False)
    plot_curves(sup.curves, tables_dir / "crossencoder_curves.png")
    sup.models.to_csv(tables_dir / "crossencoder_models.csv", index=False)
    run.write_part("sup_signals", sup_signals_table(texts, fold_column(texts, ce_folds), sup.signals), "part-0")

    feature_cols = [c for c in features.columns if c not in (*KEYS, "probe_f1", "utility")]
    data = data.merge(
        features[["qid", "iteration", *feature_cols]], on=["qid", "iteration"], how="left", validate="one_to_one"
    )
    data = data.merge(sup.signals, on=["qid", "iteration"], how="left", validate="one_to_one")

    sets = {g: groups.group_columns(g, cfg.unsup_columns, cfg.relations) for g in cfg.groups}
    if cfg.chosen_group not in sets:
        sets[cfg.chosen_group] = groups.group_columns(cfg.chosen_group, cfg.unsup_columns, cfg.relations)
    grid = head_grid(data, fold_of_row, sets, cfg, seed, map_cells=fit_cells_on_ray)
    ablation = head_grid(
        data, fold_of_row, ablation_sets(cfg), cfg, seed, "source", cfg.ablation_windows, map_cells=fit_cells_on_ray
    )

    chosen = grid.predictions[(cfg.chosen_group, cfg.chosen_window)]
    run.write_part(
        "predictions", prediction_table(data, fold_of_row, cfg.chosen_group, cfg.chosen_window, chosen), "part-0"
    )
    grid_tables = [prediction_table(data, fold_of_row, g, w, p) for (g, w), p in grid.predictions.items()]
    run.write_part("prediction_grid", pa.concat_tables(grid_tables), "part-0")
    bundle_rows = data["qid"].isin(train_qids).to_numpy() if train_run is not None else None
    fit_bundle_heads(data, sets[cfg.chosen_group], cfg, seed, models_dir, sup.bundle_models, bundle_rows)

    tables = [t.assign(protocol=protocol) for t in (grid.results, ablation.results, ce_table)]
    write_tables(tables_dir, *tables, cfg)
    return {
        "questions": int((~questions["qid"].isin(train_qids)).sum()),
        "train_questions": len(train_qids),
        "protocol": protocol,
        "rows": int((fold_of_row != NOT_PREDICTED).sum()),
        "table3": grid.results,
        "table4": ablation.results,
        "crossencoders": ce_table,
        "models": sup.models,
        "seconds": time.monotonic() - started,
    }


STAGE = RunDirStage(
    name="train",
    description=DESCRIPTION,
    run_dir_help="a run directory with iterations/ and features/",
    train_run=True,
    headline=train_headline,  # what tracking.mlflow_uri logs
)


def _train(stage: StageRun) -> dict[str, object]:
    run, config, train_run = stage.run, stage.config, stage.train_run
    types = {}
    if config.train.include_type:
        types = {**run_question_types(run.path), **(run_question_types(train_run.path) if train_run else {})}
    storage = storage_location(config.ray.storage_path, run.path, f"models/{TRAIN_STORAGE}")
    return run_train(
        run,
        config.train,
        doc_lookup_for(config),
        seed=config.seed,
        train_run=train_run,
        question_types=types,
        trainer=partial(train_crossencoders, storage=storage),
    )


def main() -> None:
    stage, summary = STAGE.main(_train)
    run = stage.run
    tables = run.path / "predictions" / "tables"
    print(
        f"\n{summary['questions']} questions, {summary['rows']} rows, {summary['seconds']:.0f} s in all; "
        f"{summary['protocol']}\n"
    )
    for name in ("crossencoders.md", "table3_signal_groups.md", "table4_unsup_sources.md"):
        print((tables / name).read_text())
    print_model_note(run)
    print(f"(tables in {tables}; bundle in {run.path / 'models'})")
