"""The head's input: the signals of the last w iterations, concatenated, and the question's type.

Slot 0 holds iteration i's own signals, slot k those of iteration i-k (``slots="previous"``, the paper's
text and the default). A slot before the trajectory's first retrieval iteration (i-k < 1) has NaN
values; with ``indicators`` (``train.head_input=indicators``) its indicator ``slot<k>_missing`` = 1,
without them (the seed's, ``head_input=seed``) nothing marks it and the head's imputer sets it to 0.
Iteration 0 (no retrieval) is never a slot, as in the seed code, whose rows start at the first
retrieval iteration.

``slots="seed_public"`` reproduces the public ``predictions/prediction_head/sequential.py``
(``build_sequential_dataframe``): it shifts ``sub_qid`` by ``i + 1 - window_size``, blanks the slots whose
shifted ``sub_qid`` is negative, but merges the shifted copies back on the per-iteration ``qid``, so
every slot that is not blanked repeats iteration i's own signals. The blanked slots are the same as
those before the trajectory start here. (Its columns run oldest slot first; the order of an MLP's
inputs changes nothing but the initial weights' assignment.)

The type one-hot (:func:`type_onehot`) follows sequential.py's ``include_type``: ``pd.get_dummies`` of
``type`` over every row of the frame, so the categories are those of training and evaluation rows
together; a question without a type has zeros.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from raypipe.core.config import TrainConfig

FIRST_ITERATION = 1
TYPE_COLUMN = "question_type"
Slots = Literal["previous", "seed_public"]


def window_column_names(feature_columns: list[str], window: int, indicators: bool = True) -> list[str]:
    names = [f"{c}@t-{k}" for k in range(window) for c in feature_columns]
    return names + ([f"slot{k}_missing" for k in range(1, window)] if indicators else [])


def build_window(
    frame: pd.DataFrame,
    feature_columns: list[str],
    window: int,
    slots: Slots = "previous",
    indicators: bool = True,
) -> tuple[np.ndarray, list[str]]:
    """Window matrix with one row per row of ``frame`` (same order), and its column names.

    ``frame`` holds one row per qid x iteration (>= 1) with the feature columns. Slot 0 is never
    missing, so only slots 1..w-1 get an indicator.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if slots not in ("previous", "seed_public"):
        raise ValueError(f"slots must be 'previous' or 'seed_public', got {slots!r}")
    missing_cols = [c for c in feature_columns if c not in frame.columns]
    if missing_cols:
        raise ValueError(f"window features missing from the table: {missing_cols}")
    if frame.duplicated(["qid", "iteration"]).any():
        raise ValueError("window input has duplicated (qid, iteration) rows")
    values = frame[feature_columns].to_numpy(dtype=np.float64)
    index = {key: pos for pos, key in enumerate(zip(frame["qid"], frame["iteration"].astype(int)))}
    iterations = frame["iteration"].to_numpy(dtype=np.int64)
    n, f = values.shape
    out = np.full((n, f * window + ((window - 1) if indicators else 0)), np.nan)
    out[:, :f] = values
    for k in range(1, window):
        flag = np.zeros(n)
        for row, (qid, it) in enumerate(zip(frame["qid"], iterations)):
            if it - k < FIRST_ITERATION:
                src = None
            else:  # seed_public never looks the earlier row up: the slot repeats this row
                src = row if slots == "seed_public" else index.get((qid, int(it) - k))
            if src is None:
                flag[row] = 1.0
            else:
                out[row, k * f : (k + 1) * f] = values[src]
        if indicators:
            out[:, f * window + k - 1] = flag
    return out, window_column_names(feature_columns, window, indicators)


def type_categories(frame: pd.DataFrame) -> list[str]:
    """The question types present in ``frame`` (sorted, as get_dummies orders them)."""
    if TYPE_COLUMN not in frame.columns:
        return []
    return sorted({str(t) for t in frame[TYPE_COLUMN].dropna()})


def type_onehot(frame: pd.DataFrame, categories: list[str]) -> tuple[np.ndarray, list[str]]:
    """One column per category: 1 where the row's question has that type (sequential.py's get_dummies)."""
    types = frame[TYPE_COLUMN] if TYPE_COLUMN in frame.columns else pd.Series([None] * len(frame))
    values = types.astype(object).to_numpy()
    matrix = (
        np.column_stack([(values == c).astype(np.float64) for c in categories])
        if categories
        else np.zeros((len(frame), 0))
    )
    return matrix, [f"type_{c}" for c in categories]


def head_inputs(
    frame: pd.DataFrame, feature_columns: list[str], window: int, cfg: TrainConfig, include_type: bool | None = None
) -> tuple[np.ndarray, list[str]]:
    """The head's input matrix under ``cfg`` (window slots, indicators, type one-hot) and its column names."""
    x, names = build_window(frame, feature_columns, window, cfg.window_slots, cfg.head_input == "indicators")
    if cfg.include_type if include_type is None else include_type:
        onehot, type_names = type_onehot(frame, type_categories(frame))
        x, names = np.hstack([x, onehot]), names + type_names
    return x, names


def window_for_last(
    history: pd.DataFrame, feature_columns: list[str], window: int, slots: Slots = "previous", indicators: bool = True
) -> np.ndarray:
    """The window row of the last iteration of one trajectory (the online path)."""
    history = history[history["iteration"] >= FIRST_ITERATION].sort_values("iteration")
    if history.empty:
        raise ValueError("no retrieval iteration yet: predictions start at iteration 1")
    matrix, _ = build_window(history.reset_index(drop=True), feature_columns, window, slots, indicators)
    return matrix[-1:]
