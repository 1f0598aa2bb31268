"""Percentile bootstrap intervals over questions for the headline figures.

Every headline figure is a ratio of per-question sums, sum(num) / sum(den): a mean over questions has
den = 1, a mean over iterations has den = the question's iteration count. Resampling questions (not
iterations) keeps each trajectory's iterations together, which is what the samples' dependence needs.
A question whose figure is undefined (e.g. no final answer) enters with num = den = 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raypipe.analysis.stats import by_agent_dataset

_CHUNK = 2_000_000  # index cells per chunk: bounds memory for large runs


def ratio_ci(
    num: np.ndarray, den: np.ndarray, samples: int, seed: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, low, high) of sum(num)/sum(den), percentile interval over resampled questions."""
    num = np.nan_to_num(np.asarray(num, dtype=float))
    den = np.asarray(den, dtype=float)
    n = len(num)
    if n == 0 or den.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    estimate = num.sum() / den.sum()
    rng = np.random.default_rng(seed)
    stats = np.empty(samples)
    per_chunk = max(1, _CHUNK // n)
    for start in range(0, samples, per_chunk):
        stop = min(samples, start + per_chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start:stop] = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    stats = stats[np.isfinite(stats)]  # a resample with no defined value at all
    if not len(stats):
        return float(estimate), float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(estimate), float(low), float(high)


def _defined(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    return values.fillna(0).to_numpy(float), values.notna().to_numpy(float)


HEADLINES = {
    "P_0": lambda s: _defined(s["p0"]),
    "final F1": lambda s: _defined(s["final_f1"]),
    "ΔF1": lambda s: _defined(s["delta_f1"]),
    "mean U_i": lambda s: (s["u_sum"].to_numpy(float), s["u_count"].to_numpy(float)),
    "zero-utility share": lambda s: (s["u_zero"].to_numpy(float), s["u_count"].to_numpy(float)),
    "mean iterations": lambda s: _defined(s["n_iterations"].astype(float)),
    "oracle iterations saved": lambda s: (
        (s["extra_iterations"] * s["natural"]).fillna(0).to_numpy(float),
        (s["last_iteration"] * s["natural"]).fillna(0).to_numpy(float),
    ),
}


def headline_intervals(summary: pd.DataFrame, samples: int, seed: int, confidence: float = 0.95) -> pd.DataFrame:
    """Long table: agent, dataset, figure, estimate, low, high (for each agent/dataset and the pooled rows)."""
    rows = []
    for agent, dataset, s in by_agent_dataset(summary):
        for figure, extract in HEADLINES.items():
            num, den = extract(s)
            estimate, low, high = ratio_ci(num, den, samples, seed, confidence)
            rows.append(
                {"agent": agent, "dataset": dataset, "figure": figure, "estimate": estimate, "low": low, "high": high}
            )
    return pd.DataFrame(rows)
