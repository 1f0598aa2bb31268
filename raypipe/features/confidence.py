"""Probe confidence: the mean token log-probability of a probed answer.

The seed paper (``probing/confidence.py``) drops the last 4 generated tokens (the forced answer's closing
tail) before averaging; a probe with no more tokens than that has no confidence. The full mean is kept as
a second signal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_logprob(token_logprobs: Sequence[float] | None, drop_last: int = 0) -> float | None:
    """Mean of the token log-probs after dropping the last ``drop_last``; ``None`` when nothing is left."""
    if drop_last < 0:
        raise ValueError(f"drop_last must be >= 0, got {drop_last}")
    if token_logprobs is None:
        return None
    values = np.asarray(token_logprobs, dtype=float)
    if drop_last:
        values = values[:-drop_last]
    if values.size == 0:
        return None
    return float(values.mean())


def delta(current: float | None, previous: float | None) -> float | None:
    """``current - previous``, or ``None`` when either side is missing."""
    if current is None or previous is None:
        return None
    return current - previous
