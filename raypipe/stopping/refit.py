"""Head refits for the sweep: out-of-fold P̂/Û from the predictors' own head code under other settings.

A Tune trial that carries a :class:`raypipe.core.config.HeadRefit` fits the windowed MLP head
(``raypipe.predict``: the same window, k-fold by question, folds and head as ``jobs/train.py``) with
its training settings and replays the threshold grid on the new predictions. The head reads the
signals of ``features/`` and the out-of-fold cross-encoder signals of ``sup_signals/`` (both written by
earlier stages); a refit whose group needs signals the run lacks is skipped.

With a training run (``--train-run``) the frame holds both runs' rows: the training run's rows get
k-fold predictions among themselves (the thresholds are chosen on them) and the target run's rows
predictions from heads fit on every training row; no target row is ever trained on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pandas as pd
import pyarrow as pa

from raypipe.core.config import HeadRefit, TrainConfig
from raypipe.core.rundir import RunDir
from raypipe.stopping.heuristic import Predictions

KEYS = ("qid", "dataset", "iteration")
# A head's predictions as a trial hands them to the driver (predictions_table)
HEAD_SCHEMA = pa.schema(
    [
        ("qid", pa.string()),
        ("iteration", pa.int32()),
        ("feature_group", pa.string()),
        ("window", pa.int32()),
        ("p_hat", pa.float64()),
        ("u_hat", pa.float64()),
    ]
)


def resolve(refit: HeadRefit, train: TrainConfig) -> HeadRefit:
    """Fill an unset group / window with the chosen head's (jobs/train.py's train.chosen_*)."""
    return refit.model_copy(
        update={"group": refit.group or train.chosen_group, "window": refit.window or train.chosen_window}
    )


def refit_label(refit: HeadRefit) -> str:
    """The head name a (resolved) refit gets in the sweep's tables (feature_group column)."""
    hidden = "-".join(str(h) for h in refit.head_hidden)
    return f"{refit.group}[refit h={hidden} wd={refit.head_weight_decay:g} lr={refit.head_learning_rate:g}]"


def refit_columns(refit: HeadRefit, train: TrainConfig) -> list[str]:
    from raypipe.predict.groups import group_columns

    assert refit.group is not None, "a resolved refit (resolve) names its group"
    return group_columns(refit.group, train.unsup_columns, train.relations)


def head_frame(run: RunDir, question_types: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Retrieval iterations (>= 1) with their targets, the signals of ``features/`` and of ``sup_signals/``,
    and the question types (for the head's type one-hot)."""
    from raypipe.predict.pipeline import prediction_rows
    from raypipe.predict.window import TYPE_COLUMN

    frame = prediction_rows(run.read("iterations").to_pandas())
    frame[TYPE_COLUMN] = frame["qid"].map(dict(question_types or {}))
    for table in ("features", "sup_signals"):
        if not run.has(table):
            continue
        signals = run.read(table).to_pandas()
        columns = [c for c in signals.columns if c not in (*KEYS, "fold", "probe_f1", "utility")]
        frame = frame.merge(
            signals[["qid", "iteration", *columns]], on=["qid", "iteration"], how="left", validate="one_to_one"
        )
    return frame


def refit_predictions(
    frame: pd.DataFrame, refit: HeadRefit, train: TrainConfig, seed: int = 0, train_qids: Collection[str] | None = None
) -> Predictions:
    """Held-out (P̂, Û) of every row of ``frame`` from heads fit with a resolved ``refit``'s settings.

    ``train_qids`` (a training run's questions): those rows k-fold among themselves, the others from
    heads fit on them all; None: k-fold over every row.
    """
    from raypipe.predict.head import out_of_fold
    from raypipe.predict.splits import assign_folds, fold_column
    from raypipe.predict.window import head_inputs

    columns = refit_columns(refit, train)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"head refit group {refit.group!r}: the run has no signals {missing}")
    frame = frame.sort_values(["qid", "iteration"]).reset_index(drop=True)
    trainable = None if train_qids is None else frame["qid"].isin(set(train_qids)).to_numpy()
    questions = frame[["qid", "dataset"]].drop_duplicates("qid")
    if train_qids is None:  # trainable is None
        folds = assign_folds(questions, train.folds, seed)
    else:  # the target questions are one more fold, fit on every training question and never trained on
        folds = dict.fromkeys(questions["qid"], train.folds)
        folds.update(assign_folds(questions[questions["qid"].isin(set(train_qids))], train.folds, seed))
    fold_of_row = fold_column(frame, folds)
    settings = refit.model_dump(include={"head_hidden", "head_weight_decay", "head_learning_rate"})
    cfg = train.model_copy(update={**settings, "head_alpha": None})  # the sklearn head's alpha follows the decay
    assert refit.window is not None, "a resolved refit (resolve) names its window"
    x, _ = head_inputs(frame, columns, refit.window, cfg)
    p = out_of_fold(x, frame["probe_f1"].to_numpy(dtype=float), fold_of_row, cfg, seed, trainable)
    u = out_of_fold(x, frame["utility"].to_numpy(dtype=float), fold_of_row, cfg, seed, trainable)
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for qid, it, ph, uh in zip(frame["qid"], frame["iteration"], p, u):
        out.setdefault(str(qid), {})[int(it)] = (float(ph), float(uh))
    return out


def predictions_table(head: tuple[str, int], predictions: Predictions) -> pa.Table:
    """One head's (P̂, Û) in the columns :func:`raypipe.stopping.grid.predictions_by_head` reads back: how a Tune
    trial hands a refit head's predictions to the driver (the paired tests replay the trade-off table's rows)."""
    rows = [
        {"qid": qid, "iteration": it, "feature_group": head[0], "window": head[1], "p_hat": p, "u_hat": u}
        for qid, per_iteration in predictions.items()
        for it, (p, u) in per_iteration.items()
    ]
    return pa.Table.from_pylist(rows, schema=HEAD_SCHEMA)


def trial_head(head: list, payload: dict) -> tuple[tuple[str, int], Predictions]:
    """A sweep trial's head from its Tune config's ``head`` and the trials' shared payload:
    ``["grid", group, window]`` (predictions of jobs/train.py) or ``["refit", i]`` (fitted here)."""
    if head[0] == "grid":
        key = (head[1], int(head[2]))
        return key, payload["predictions"][key]
    refit = payload["refits"][int(head[1])]
    preds = refit_predictions(payload["refit_frame"], refit, payload["train"], payload["seed"], payload["train_qids"])
    return (refit_label(refit), refit.window), preds
