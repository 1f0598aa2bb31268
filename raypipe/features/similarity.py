"""Cosine similarity between sentence embeddings (SBERT all-MiniLM-L6-v2 in the seed paper)."""

from __future__ import annotations

import numpy as np


def cosine(u: np.ndarray | None, v: np.ndarray | None) -> float | None:
    """Cosine of two vectors; ``None`` when either is missing or has zero norm."""
    if u is None or v is None:
        return None
    u, v = np.asarray(u, dtype=float), np.asarray(v, dtype=float)
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    if norm == 0.0:
        return None
    return float(np.dot(u, v) / norm)
