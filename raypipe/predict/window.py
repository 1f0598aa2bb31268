"""The head's input: the signals of the last w iterations, concatenated (a true sliding window).

Slot 0 holds iteration i's own signals, slot k those of iteration i-k. A slot before the trajectory's
first retrieval iteration (i-k < 1) has NaN values and its indicator ``slot<k>_missing`` = 1; the head
scales the observed values and then fills NaN with 0 (the training mean). Iteration 0 (no retrieval)
is never a slot, as in the seed code, whose rows start at the first retrieval iteration.

The seed's public ``sequential.py`` shifts the iteration number but merges the shifted copies back on
the row key, so every slot repeats the current row; here slot k is looked up by (qid, i-k).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

FIRST_ITERATION = 1


def window_column_names(feature_columns: list[str], window: int) -> list[str]:
    names = [f"{c}@t-{k}" for k in range(window) for c in feature_columns]
    return names + [f"slot{k}_missing" for k in range(1, window)]


def build_window(frame: pd.DataFrame, feature_columns: list[str], window: int) -> tuple[np.ndarray, list[str]]:
    """Window matrix with one row per row of ``frame`` (same order), and its column names.

    ``frame`` holds one row per qid x iteration (>= 1) with the feature columns. Slot 0 is never
    missing, so only slots 1..w-1 get an indicator.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    missing_cols = [c for c in feature_columns if c not in frame.columns]
    if missing_cols:
        raise ValueError(f"window features missing from the table: {missing_cols}")
    if frame.duplicated(["qid", "iteration"]).any():
        raise ValueError("window input has duplicated (qid, iteration) rows")
    values = frame[feature_columns].to_numpy(dtype=np.float64)
    index = {key: pos for pos, key in enumerate(zip(frame["qid"], frame["iteration"].astype(int)))}
    iterations = frame["iteration"].to_numpy(dtype=np.int64)
    n, f = values.shape
    out = np.full((n, f * window + (window - 1)), np.nan)
    out[:, :f] = values
    for k in range(1, window):
        flag = np.zeros(n)
        for row, (qid, it) in enumerate(zip(frame["qid"], iterations)):
            src = index.get((qid, int(it) - k)) if it - k >= FIRST_ITERATION else None
            if src is None:
                flag[row] = 1.0
            else:
                out[row, k * f : (k + 1) * f] = values[src]
        out[:, f * window + k - 1] = flag
    return out, window_column_names(feature_columns, window)


def window_for_last(history: pd.DataFrame, feature_columns: list[str], window: int) -> np.ndarray:
    """The window row of the last iteration of one trajectory (the online path)."""
    history = history[history["iteration"] >= FIRST_ITERATION].sort_values("iteration")
    if history.empty:
        raise ValueError("no retrieval iteration yet: predictions start at iteration 1")
    matrix, _ = build_window(history.reset_index(drop=True), feature_columns, window)
    return matrix[-1:]
