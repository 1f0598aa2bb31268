"""Head refits for the sweep: out-of-fold P̂/Û from the predictors' own head code under other settings.

A Tune trial that carries a :class:`raypipe.core.config.HeadRefit` fits the windowed MLP head
(``raypipe.predict``: the same window, k-fold by question, folds and head as ``jobs/train.py``) with
its training settings and replays the threshold grid on the new predictions. The head reads the
signals of ``features/`` and the out-of-fold cross-encoder signals of ``sup_signals/`` (both written by
earlier stages); a refit whose group needs signals the run lacks is skipped.
"""

from __future__ import annotations

import pandas as pd

from raypipe.core.config import HeadRefit, TrainConfig
from raypipe.core.rundir import RunDir
from raypipe.stopping.heuristic import Predictions

KEYS = ("qid", "dataset", "iteration")


def resolve(refit: HeadRefit, train: TrainConfig) -> HeadRefit:
    """Fill an unset group / window with the chosen head's (jobs/train.py's train.chosen_*)."""
    return refit.model_copy(
        update={"group": refit.group or train.chosen_group, "window": refit.window or train.chosen_window}
    )


def refit_label(refit: HeadRefit) -> str:
    """The head name a (resolved) refit gets in the sweep's tables (feature_group column)."""
    hidden = "-".join(str(h) for h in refit.head_hidden)
    return f"{refit.group}[refit h={hidden} a={refit.head_alpha:g} lr={refit.head_learning_rate:g}]"


def refit_columns(refit: HeadRefit, train: TrainConfig) -> list[str]:
    from raypipe.predict.groups import group_columns

    return group_columns(refit.group, train.unsup_columns, train.relations)


def head_frame(run: RunDir) -> pd.DataFrame:
    """Retrieval iterations (>= 1) with their targets, the signals of ``features/`` and of ``sup_signals/``."""
    from raypipe.predict.pipeline import prediction_rows

    frame = prediction_rows(run.read("iterations").to_pandas())
    for table in ("features", "sup_signals"):
        if not run.has(table):
            continue
        signals = run.read(table).to_pandas()
        columns = [c for c in signals.columns if c not in (*KEYS, "fold", "probe_f1", "utility")]
        frame = frame.merge(
            signals[["qid", "iteration", *columns]], on=["qid", "iteration"], how="left", validate="one_to_one"
        )
    return frame


def refit_predictions(frame: pd.DataFrame, refit: HeadRefit, train: TrainConfig, seed: int = 0) -> Predictions:
    """Out-of-fold (P̂, Û) of every row of ``frame`` from heads fit with a resolved ``refit``'s settings."""
    from raypipe.predict.head import out_of_fold
    from raypipe.predict.splits import assign_folds, fold_column
    from raypipe.predict.window import build_window

    columns = refit_columns(refit, train)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"head refit group {refit.group!r}: the run has no signals {missing}")
    frame = frame.sort_values(["qid", "iteration"]).reset_index(drop=True)
    folds = assign_folds(frame[["qid", "dataset"]].drop_duplicates("qid"), train.folds, seed)
    fold_of_row = fold_column(frame, folds)
    x, _ = build_window(frame, columns, refit.window)
    cfg = train.model_copy(update=refit.model_dump(include={"head_hidden", "head_alpha", "head_learning_rate"}))
    p = out_of_fold(x, frame["probe_f1"].to_numpy(dtype=float), fold_of_row, cfg, seed)
    u = out_of_fold(x, frame["utility"].to_numpy(dtype=float), fold_of_row, cfg, seed)
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for qid, it, ph, uh in zip(frame["qid"], frame["iteration"], p, u):
        out.setdefault(str(qid), {})[int(it)] = (float(ph), float(uh))
    return out
