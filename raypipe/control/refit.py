"""Head refits for the sweep: out-of-fold P̂/Û from the predictors' own head code under other settings.

A Tune trial that carries a :class:`raypipe.config.HeadRefit` fits the windowed MLP head
(``raypipe.predict``: the same window, k-fold by question and head as ``jobs/train.py``) with its
training settings and replays the threshold grid on the new predictions. Only signal groups that
``RUN_DIR/features/`` holds (unsup, prob) can be refit: the cross-encoder signals (sup) are computed
inside ``jobs/train.py`` and not persisted, so heads that use them come from ``prediction_grid`` only.
"""

from __future__ import annotations

import pandas as pd

from raypipe.config import HeadRefit, TrainConfig
from raypipe.control.heuristic import Predictions
from raypipe.rundir import RunDir

FAMILIES_FROM_FEATURES = ("unsup", "prob")


def refit_label(refit: HeadRefit) -> str:
    """The head name a refit gets in the sweep's tables (feature_group column)."""
    hidden = "-".join(str(h) for h in refit.head_hidden)
    return f"{refit.group}[refit h={hidden} a={refit.head_alpha:g} lr={refit.head_learning_rate:g}]"


def head_frame(run: RunDir) -> pd.DataFrame:
    """Retrieval iterations (>= 1) with their targets and every signal of ``features/``."""
    from raypipe.predict.pipeline import prediction_rows

    rows = prediction_rows(run.read("iterations").to_pandas())
    features = run.read("features").to_pandas()
    signals = [c for c in features.columns if c not in ("qid", "dataset", "iteration", "probe_f1", "utility")]
    return rows.merge(
        features[["qid", "iteration", *signals]], on=["qid", "iteration"], how="left", validate="one_to_one"
    )


def refit_predictions(frame: pd.DataFrame, refit: HeadRefit, train: TrainConfig, seed: int = 0) -> Predictions:
    """Out-of-fold (P̂, Û) of every row of ``frame`` from heads fit with ``refit``'s settings."""
    from raypipe.predict.groups import group_columns
    from raypipe.predict.head import out_of_fold
    from raypipe.predict.splits import assign_folds, fold_column
    from raypipe.predict.window import build_window

    families = refit.group.split("+")
    unknown = [f for f in families if f not in FAMILIES_FROM_FEATURES]
    if unknown:
        raise ValueError(
            f"head refit group {refit.group!r}: {unknown} signals are not persisted by jobs/train.py; "
            f"refits use {' / '.join(FAMILIES_FROM_FEATURES)} only"
        )
    columns = group_columns(refit.group, train.unsup_columns, train.relations)
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
