"""The train stage's steps, free of Ray: out-of-fold cross-encoder signals, the windowed head grid,
evaluation, the bundle (the stage that runs them is :mod:`raypipe.stages.train`).

Two protocols (``raypipe.predict.splits.protocol_note`` names the one of each table):

- cross-fitting within one run (no training run): k-fold by question with one fold assignment, the
  cross-encoders of fold f and the heads of fold f are trained on the other folds' questions and
  predict fold f's rows, so every row gets predictions from models that never saw its question. (The
  heads' training rows carry cross-encoder predictions from models that did see fold f's questions;
  that is ordinary stacking.)
- train on a training run, evaluate on the target run (``--train-run``, the seed paper's §5.3: trained
  on the training splits, evaluated on dev): the training rows have fold ``NOT_PREDICTED`` and the
  target rows fold 0. One cross-encoder per relation x target is fit on the training rows and predicts
  every row, the training rows in sample, as the public code applies one checkpoint per relation x
  target (``predictions/supervised/train.py`` then ``predict.py``); the heads are fit on the training
  rows and predict the target rows; only the target rows are scored.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from raypipe.core.config import TrainConfig
from raypipe.core.schema import PREDICTIONS, SUP_COLUMNS, SUP_SIGNALS
from raypipe.predict import evaluate, groups
from raypipe.predict.bundle import MANIFEST
from raypipe.predict.crossencoder import Task, TrainedModel, load_crossencoder, predict_texts
from raypipe.predict.head import NOT_PREDICTED, fit_head, out_of_fold
from raypipe.predict.relations import TARGETS
from raypipe.predict.splits import fold_column
from raypipe.predict.window import head_inputs

log = logging.getLogger(__name__)
KEYS = ["qid", "dataset", "iteration"]
# trainer(tasks, cfg, models_dir, seed) -> {task name: TrainedModel}: every task's model trained (or reused)
Trainer = Callable[[list[Task], TrainConfig, Path, int], dict[str, TrainedModel]]
CellSpec = tuple[list[str], str, int]  # one head grid cell: feature columns, target column, window
CellScores = tuple[np.ndarray, dict[str, float]]  # its out-of-fold predictions and scores
# map_cells(data, fold_of_row, specs, cfg, seed) -> one CellScores per spec, in order
CellMapper = Callable[[pd.DataFrame, np.ndarray, list[CellSpec], TrainConfig, int], list[CellScores]]


@dataclass
class SupervisedResult:
    signals: pd.DataFrame  # qid, iteration, sup_* (out of fold)
    models: pd.DataFrame  # one row per relation x target x fold: rows, seconds, final loss, path
    curves: dict[str, pd.DataFrame] = field(default_factory=dict)  # name -> curve
    bundle_models: dict[str, str] = field(default_factory=dict)  # sup column -> model folder


def prediction_rows(iterations: pd.DataFrame) -> pd.DataFrame:
    """The rows predicted: every retrieval iteration (>= 1), with its targets."""
    rows = iterations.loc[iterations["iteration"] >= 1, [*KEYS, "probe_f1", "utility"]]
    return rows.sort_values(["qid", "iteration"]).reset_index(drop=True)


def crossencoder_fits(
    fold_of_row: np.ndarray, cfg: TrainConfig, train_rows: np.ndarray | None = None
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(fold name, rows trained on, rows predicted) of each relation x target's cross-encoders.

    Cross-fitting: one fit per fold (the other folds' rows, predicting the fold's), plus ``all`` with
    ``refit_full``; with ``train_rows`` (a training run): one fit, ``train``, predicting every row.
    """
    if train_rows is not None:
        return [("train", np.asarray(train_rows, bool), np.ones(len(fold_of_row), bool))]
    fits = [(str(f), fold_of_row != f, fold_of_row == f) for f in sorted(set(fold_of_row))]
    if cfg.refit_full:
        fits.append(("all", np.ones(len(fold_of_row), bool), np.zeros(len(fold_of_row), bool)))
    return fits


def supervised_signals(
    texts: pd.DataFrame,
    folds: dict[str, int],
    cfg: TrainConfig,
    models_dir: Path,
    trainer: Trainer,
    seed: int = 0,
    train_rows: np.ndarray | None = None,
) -> SupervisedResult:
    """Cross-encoders for every relation x target x fit (one ``trainer`` call) and their predictions.

    ``folds`` are the cross-encoders' question folds; ``train_rows`` (rows of a training run) switches to
    train-on-the-training-run (:func:`crossencoder_fits`).
    """
    fold_of_row = fold_column(texts, folds)
    fits = crossencoder_fits(fold_of_row, cfg, train_rows)
    tasks, plan = [], []
    for relation in cfg.relations:
        text = texts[f"text_{relation}"].tolist()
        for short, target in TARGETS.items():
            y = texts[target].to_numpy(dtype=float)
            for fold, train, test in fits:
                name = f"{relation}_{short}_fold{fold}"
                tasks.append(Task(name, relation, [t for t, k in zip(text, train) if k], y[train].tolist()))
                plan.append((name, relation, short, fold, test))
    trained = trainer(tasks, cfg, models_dir, seed)

    signals = texts[["qid", "iteration"]].copy()
    records, curves, bundle = [], {}, {}
    bundle_fold = "train" if train_rows is not None else ("all" if cfg.refit_full else fits[0][0])
    for name, relation, short, fold, test in plan:
        column, model = groups.sup_column(relation, short), trained[name]
        if column not in signals:
            signals[column] = np.nan
        if test.any():
            loaded = load_crossencoder(model.path)
            text = texts.loc[test, f"text_{relation}"].tolist()
            signals.loc[test, column] = predict_texts(loaded, text, cfg.max_tokens)
        if fold == bundle_fold:
            bundle[column] = str(model.path.relative_to(models_dir))
        curves[name] = model.curve
        records.append(
            {
                "relation": relation,
                "target": short,
                "fold": fold,
                "rows": model.rows,
                "seconds": round(model.seconds, 1),
                "epochs": cfg.epochs,
                "effective_batch_size": model.effective_batch_size,
                "steps": len(model.curve),
                "final_loss": float(model.curve["loss"].iloc[-1]),
            }
        )
    return SupervisedResult(signals, pd.DataFrame.from_records(records), curves, bundle)


def crossencoder_scores(
    texts: pd.DataFrame, sup: SupervisedResult, cfg: TrainConfig, evaluated: np.ndarray | None = None
) -> pd.DataFrame:
    """Held-out Pearson/Kendall of each cross-encoder against its own target (on the ``evaluated`` rows,
    default all), with its training time."""
    rows = []
    keep = np.ones(len(texts), bool) if evaluated is None else np.asarray(evaluated, bool)
    groups_ = texts["qid"].to_numpy()[keep]
    for relation in cfg.relations:
        for short, target in TARGETS.items():
            column = groups.sup_column(relation, short)
            s = evaluate.score(
                texts[target].to_numpy(float)[keep],
                sup.signals[column].to_numpy(float)[keep],
                groups_,
                cfg.bootstrap_samples,
                cfg.confidence,
            )
            m = sup.models[(sup.models["relation"] == relation) & (sup.models["target"] == short)]
            rows.append(
                {
                    "relation": relation,
                    "target": short,
                    **s,
                    "train_seconds_total": round(float(m["seconds"].sum()), 1),
                    "train_seconds_per_model": round(float(m["seconds"].mean()), 1),
                    "models": len(m),
                }
            )
    return pd.DataFrame(rows)


@dataclass
class HeadGrid:
    results: pd.DataFrame  # table rows: group/source, target, window, n, pearson, ..., fisher_z, fisher_p, significant
    predictions: dict[tuple[str, int], dict[str, np.ndarray]]  # (group, window) -> {"p": ..., "u": ...}


def head_grid(
    data: pd.DataFrame,
    fold_of_row: np.ndarray,
    column_sets: dict[str, list[str]],
    cfg: TrainConfig,
    seed: int = 0,
    label: str = "group",
    windows: list[int] | None = None,
    map_cells: CellMapper | None = None,
) -> HeadGrid:
    """Held-out head predictions and scores for every column set x target x window (default cfg.windows):
    rows of folds >= 0 are predicted and scored, rows of fold ``NOT_PREDICTED`` only trained on.

    ``map_cells`` fits the cells (default :func:`fit_cells`, in this process; the train stage passes one
    that runs them as Ray tasks).
    """
    windows = sorted(windows or cfg.windows)
    jobs = [(name, short, w) for name in column_sets for short in TARGETS for w in windows]
    specs = [(column_sets[n], TARGETS[s], w) for n, s, w in jobs]
    outputs = (map_cells or fit_cells)(data, fold_of_row, specs, cfg, seed)
    results, preds, base = [], {}, {}
    for (name, short, window), (pred, s) in zip(jobs, outputs):
        preds.setdefault((name, window), {})[short] = pred
        if window == 1:
            base[(name, short)] = s
            z, p = float("nan"), float("nan")
        else:
            b = base[(name, short)]
            z, p = evaluate.fisher_z_test(s["pearson"], s["n"], b["pearson"], b["n"], cfg.fisher_alternative)
        results.append(
            {
                label: name,
                "target": short,
                "window": window,
                **s,
                "fisher_z": z,
                "fisher_p": p,
                "significant": bool(p < cfg.significance) if not np.isnan(p) else False,
            }
        )
        log.info("%s=%s target=%s w=%d: r=%.3f tau=%.3f", label, name, short, window, s["pearson"], s["kendall"])
    return HeadGrid(pd.DataFrame(results), preds)


def fit_and_score(
    data: pd.DataFrame,
    fold_of_row: np.ndarray,
    columns: list[str],
    target: str,
    window: int,
    cfg: TrainConfig,
    seed: int,
) -> CellScores:
    """One grid cell: held-out predictions of ``target`` from the window of ``columns``, and their scores."""
    x, _ = head_inputs(data, columns, window, cfg)
    y = data[target].to_numpy(dtype=float)
    pred = out_of_fold(x, y, fold_of_row, cfg, seed)
    scored = fold_of_row != NOT_PREDICTED
    qids = data["qid"].to_numpy()
    return pred, evaluate.score(y[scored], pred[scored], qids[scored], cfg.bootstrap_samples, cfg.confidence, seed)


def fit_cells(
    data: pd.DataFrame, fold_of_row: np.ndarray, specs: list[CellSpec], cfg: TrainConfig, seed: int
) -> list[CellScores]:
    """Every grid cell in turn, in this process."""
    return [fit_and_score(data, fold_of_row, cols, target, w, cfg, seed) for cols, target, w in specs]


def ablation_sets(cfg: TrainConfig) -> dict[str, list[str]]:
    """Table 4: the ablation group with its unsupervised signals restricted to one source (or all)."""
    others = [f for f in cfg.ablation_group.split("+") if f != "unsup"]
    extra = groups.group_columns("+".join(others), cfg.unsup_columns, cfg.relations) if others else []
    return {src: [*cols, *extra] for src, cols in groups.ablation_groups(cfg.unsup_columns).items()}


def sup_signals_table(texts: pd.DataFrame, fold_of_row: np.ndarray, signals: pd.DataFrame) -> pa.Table:
    """The held-out cross-encoder predictions (rows of folds >= 0) as the SUP_SIGNALS table (untrained
    relations null)."""
    keep = fold_of_row != NOT_PREDICTED
    texts, fold_of_row, signals = texts[keep], fold_of_row[keep], signals[keep]
    frame = texts[KEYS].copy()
    frame["iteration"] = frame["iteration"].astype(np.int32)
    frame["fold"] = fold_of_row.astype(np.int32)
    for column in SUP_COLUMNS:
        frame[column] = signals[column].to_numpy(dtype=float) if column in signals else np.nan
    return pa.Table.from_pandas(frame[SUP_SIGNALS.names], schema=SUP_SIGNALS, preserve_index=False)


def prediction_table(data: pd.DataFrame, fold_of_row: np.ndarray, group: str, window: int, preds: dict) -> pa.Table:
    """The predicted rows (folds >= 0) of one head as a PREDICTIONS table."""
    keep = fold_of_row != NOT_PREDICTED
    frame = data.loc[keep, [*KEYS]].copy()
    frame["fold"] = fold_of_row[keep].astype(np.int32)
    frame["feature_group"] = group
    frame["window"] = np.int32(window)
    frame["p_hat"] = preds["p"][keep].astype(np.float32)
    frame["u_hat"] = preds["u"][keep].astype(np.float32)
    frame["probe_f1"] = data.loc[keep, "probe_f1"].astype(np.float32)
    frame["utility"] = data.loc[keep, "utility"].astype(np.float32)
    return pa.Table.from_pandas(frame[PREDICTIONS.names], schema=PREDICTIONS, preserve_index=False)


def fit_bundle_heads(
    data: pd.DataFrame,
    columns: list[str],
    cfg: TrainConfig,
    seed: int,
    models_dir: Path,
    sup: dict,
    rows: np.ndarray | None = None,
) -> Path:
    """Heads of the chosen configuration fit on every training question (``rows``, default all), saved
    with the manifest.

    Without the question-type one-hot: the online controller sees a question, not its dataset
    annotation; the manifest says so (``question_type``).
    """
    keep = np.ones(len(data), bool) if rows is None else np.asarray(rows, bool)
    data = data[keep].reset_index(drop=True)
    x, names = head_inputs(data, columns, cfg.chosen_window, cfg, include_type=False)
    models_dir.mkdir(parents=True, exist_ok=True)
    for short, target in TARGETS.items():
        head = fit_head(x, data[target].to_numpy(dtype=float), cfg, seed)
        with open(models_dir / f"head_{short}.pkl", "wb") as fh:
            pickle.dump(head, fh)
    manifest = {
        "feature_group": cfg.chosen_group,
        "window": cfg.chosen_window,
        "feature_columns": columns,
        "window_columns": names,
        "window_options": {"slots": cfg.window_slots, "indicators": cfg.head_input == "indicators"},
        "question_type": "not an input of the bundled heads (unknown online), whatever train.include_type says",
        "crossencoders": sup,
        "relations": list(cfg.relations),
        "train": cfg.model_dump(mode="json"),
    }
    path = models_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2))
    return path
