"""Rank-biased overlap (Webber, Moffat & Zobel 2010) between two ranked lists of document ids.

Two named variants:

- :func:`rbo_truncated`: what PyTerrier-alpha's ``rbo`` computes and the seed paper used. Both lists are cut
  at ``depth``; the agreement ``|A_d ∩ B_d| / d`` is then summed with weights ``p^(d-1)`` over a fixed
  horizon of 1000 ranks (the overlap stays frozen once the lists end) and divided by the sum of those
  weights. It never reaches 1: two identical top-3 lists score about 0.1146 at p=0.99, top-20 about 0.424.
- :func:`rbo_extrapolated`: Webber et al.'s RBO_EXT (their eq. 32, which also covers lists of unequal
  length): identical lists score 1, disjoint lists 0.

An empty list on either side gives ``None`` here (no ranking to compare); the features stage turns that
into the seed's 0.0 unless ``features.rbo_missing="undefined"`` (see :mod:`raypipe.features.extract`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raypipe.core.config import FeaturesConfig

SEED_P = FeaturesConfig().rbo_p  # the seed paper's persistence (the features section's default)
PTA_HORIZON = 1000  # ranks PyTerrier-alpha's loop always runs over


def _overlaps(a: Sequence[str], b: Sequence[str], length: int) -> np.ndarray:
    """``X_d = |A_d ∩ B_d|`` for d = 1..length (a list past its end contributes nothing new)."""
    seen_a: set[str] = set()
    seen_b: set[str] = set()
    overlap = 0
    out = np.empty(length, dtype=float)
    for i in range(length):
        if i < len(a) and a[i] not in seen_a:
            seen_a.add(a[i])
            overlap += a[i] in seen_b
        if i < len(b) and b[i] not in seen_b:
            seen_b.add(b[i])
            overlap += b[i] in seen_a
        out[i] = overlap
    return out


def rbo_truncated(a: Sequence[str], b: Sequence[str], depth: int, p: float = SEED_P) -> float | None:
    """PyTerrier-alpha's (non-extrapolated) RBO of the top ``depth`` of two lists."""
    _check(depth, p)
    a, b = list(a)[:depth], list(b)[:depth]
    if not a or not b:
        return None
    seen = max(len(a), len(b))
    x = np.empty(PTA_HORIZON, dtype=float)
    x[:seen] = _overlaps(a, b, seen)
    x[seen:] = x[seen - 1]
    ranks = np.arange(1, PTA_HORIZON + 1)
    weights = p ** (ranks - 1)
    return float(np.sum(weights * x / ranks) / np.sum(weights))


def rbo_extrapolated(a: Sequence[str], b: Sequence[str], depth: int, p: float = SEED_P) -> float | None:
    """Webber et al.'s extrapolated RBO (RBO_EXT) of the top ``depth`` of two lists."""
    _check(depth, p)
    a, b = list(a)[:depth], list(b)[:depth]
    if not a or not b:
        return None
    a, b = list(dict.fromkeys(a)), list(dict.fromkeys(b))  # a repeated id counts once
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    s, n = len(short), len(long_)  # Webber et al.'s s and l
    x = _overlaps(short, long_, n)
    d = np.arange(1, n + 1)
    pd_ = p**d
    head = np.sum(x / d * pd_)
    x_s, x_l = x[s - 1], x[n - 1]
    tail = np.sum((x_s * (d - s) / (s * d) * pd_)[s:])
    return float((1 - p) / p * (head + tail) + ((x_l - x_s) / n + x_s / s) * p**n)


def _check(depth: int, p: float) -> None:
    if depth < 1:
        raise ValueError(f"RBO depth must be >= 1, got {depth}")
    if not 0 < p < 1:
        raise ValueError(f"RBO persistence p must be in (0, 1), got {p}")
