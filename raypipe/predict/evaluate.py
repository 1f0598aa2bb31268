"""Correlation of predictions with targets: Pearson r, Kendall tau, Fisher's z test, bootstrap intervals.

The seed paper tests a window's gain over w=1 with Fisher's z test (p < 0.05): both correlations are
z-transformed (atanh) and compared as independent samples, z = (z_w - z_1) / sqrt(1/(n_w-3) + 1/(n_1-3)).
The two correlations are measured on the same rows, so the test is conservative (it ignores their
covariance); it is kept because it is the paper's. "A gain" is one-sided (alternative="greater").
Intervals resample questions, not rows: iterations of one question are not independent.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from raypipe.core.stats import MIN_PAIRS, finite_pairs, pearson, percentile_interval, resamples


def kendall(y: np.ndarray, p: np.ndarray) -> float:
    y, p = finite_pairs(y, p)
    if len(y) < MIN_PAIRS:
        return float("nan")
    return float(stats.kendalltau(y, p)[0])  # tau-b, handles the many ties of F1 targets


def fisher_z_test(r_a: float, n_a: int, r_b: float, n_b: int, alternative: str = "greater") -> tuple[float, float]:
    """(z, p) for H1: r_a > r_b ('greater') or r_a != r_b ('two-sided')."""
    if min(n_a, n_b) <= 3:
        raise ValueError("Fisher's z test needs more than 3 observations per correlation")
    if any(math.isnan(r) for r in (r_a, r_b)):
        return float("nan"), float("nan")
    clip = 1 - 1e-12
    z = (math.atanh(max(-clip, min(clip, r_a))) - math.atanh(max(-clip, min(clip, r_b)))) / math.sqrt(
        1 / (n_a - 3) + 1 / (n_b - 3)
    )
    if alternative == "greater":
        return z, float(stats.norm.sf(z))
    if alternative == "two-sided":
        return z, float(2 * stats.norm.sf(abs(z)))
    raise ValueError(f"alternative must be 'greater' or 'two-sided', got {alternative!r}")


def bootstrap_ci(
    y: np.ndarray,
    p: np.ndarray,
    groups: np.ndarray,
    statistic=pearson,
    samples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``statistic`` over resamples of whole groups (questions)."""
    y, p, groups = np.asarray(y, dtype=float), np.asarray(p, dtype=float), np.asarray(groups)
    uniques, codes = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(codes == g) for g in range(len(uniques))]
    values = [
        statistic(y[rows], p[rows])
        for block in resamples(len(members), samples, seed)
        for rows in (np.concatenate([members[g] for g in pick]) for pick in block)
    ]
    return percentile_interval(np.asarray(values), confidence)


def score(y, p, groups, samples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Pearson r and Kendall tau with their question-bootstrap intervals, and n (rows with both values)."""
    yc, _ = finite_pairs(y, p)
    r_lo, r_hi = bootstrap_ci(y, p, groups, pearson, samples, confidence, seed)
    t_lo, t_hi = bootstrap_ci(y, p, groups, kendall, samples, confidence, seed)
    return {
        "n": len(yc),
        "pearson": pearson(y, p),
        "pearson_lo": r_lo,
        "pearson_hi": r_hi,
        "kendall": kendall(y, p),
        "kendall_lo": t_lo,
        "kendall_hi": t_hi,
    }
