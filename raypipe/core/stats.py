"""Statistics shared by the layers: a mean of what may be empty, Pearson r over usable pairs, and the question
bootstrap.

The bootstrap resamples questions (with replacement), never iterations: the iterations of one
question are not independent. Every caller draws its resamples from :func:`resamples` with its seed,
so the same seed gives the same resamples, however they are chunked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

MIN_PAIRS = 3
_CHUNK = 2_000_000  # index cells per block of resamples: bounds memory for large runs


def mean_or_nan(values: Iterable[float]) -> float:
    """The mean of ``values`` (booleans count 0/1); NaN when there are none."""
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else float("nan")


def finite_pairs(x: Sequence[float | None], y: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """The pairs where both values are finite (None counts as missing)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def pearson(x: Sequence[float | None], y: Sequence[float | None]) -> float:
    """Pearson r over the finite pairs; NaN with fewer than 3 pairs or a constant side."""
    a, b = finite_pairs(x, y)
    if len(a) < MIN_PAIRS or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def resamples(n: int, samples: int, seed: int) -> Iterator[np.ndarray]:
    """``samples`` bootstrap resamples of ``n`` items as (resamples x n) index blocks, in order."""
    rng = np.random.default_rng(seed)
    per_block = max(1, _CHUNK // max(n, 1))
    for start in range(0, samples, per_block):
        yield rng.integers(0, n, size=(min(samples, start + per_block) - start, n))


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of the finite values (NaNs when there are none)."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]  # a resample with no defined value is skipped
    if not len(finite):
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    low, high = np.quantile(finite, [alpha, 1 - alpha])
    return float(low), float(high)
