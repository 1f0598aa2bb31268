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
from raypipe.core.stats import percentile_interval, resamples


def ratio_cis(
    num: np.ndarray, den: np.ndarray, samples: int, seed: int, confidence: float = 0.95
) -> list[tuple[float, float, float]]:
    """(estimate, low, high) of sum(num[k])/sum(den[k]) for each row k of (figures x questions) arrays.

    All figures share the same resamples, so their intervals are consistent with one another.
    """
    num = np.nan_to_num(np.atleast_2d(np.asarray(num, dtype=float)))
    den = np.atleast_2d(np.asarray(den, dtype=float))
    figures, n = num.shape
    if n == 0:
        return [(float("nan"),) * 3] * figures
    values = np.empty((figures, samples))
    start = 0
    for idx in resamples(n, samples, seed):
        with np.errstate(invalid="ignore", divide="ignore"):
            for k in range(figures):
                values[k, start : start + len(idx)] = num[k][idx].sum(axis=1) / den[k][idx].sum(axis=1)
        start += len(idx)
    return [
        (float(num[k].sum() / den[k].sum()), *percentile_interval(values[k], confidence))
        if den[k].sum()
        else (float("nan"),) * 3
        for k in range(figures)
    ]


def ratio_ci(
    num: np.ndarray, den: np.ndarray, samples: int, seed: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, low, high) of sum(num)/sum(den), percentile interval over resampled questions."""
    return ratio_cis(num, den, samples, seed, confidence)[0]


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
        pairs = [extract(s) for extract in HEADLINES.values()]
        cis = ratio_cis(np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs]), samples, seed, confidence)
        for figure, (estimate, low, high) in zip(HEADLINES, cis):
            rows.append(
                {"agent": agent, "dataset": dataset, "figure": figure, "estimate": estimate, "low": low, "high": high}
            )
    return pd.DataFrame(rows)
