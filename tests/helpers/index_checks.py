"""Checks on stored index vectors shared by the retrieval and feature tests."""

from __future__ import annotations

import numpy as np


def assert_rows_are_their_passages(stored: np.ndarray, fresh: np.ndarray, floor: float = 0.97) -> None:
    """Row i of the index is passage i: closest to its own fp32 passage vector, at cosine above ``floor``.

    The index may hold the shipped float16 vectors or an int8 encoder's (``retrieval.encoder_quantization=int8``), so
    rows are compared by cosine, not equality.
    """
    cosine = stored @ fresh.T
    assert (cosine.argmax(axis=1) == np.arange(len(stored))).all()
    assert cosine.diagonal().min() > floor
