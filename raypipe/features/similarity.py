"""Cosine similarity between sentence embeddings (SBERT all-MiniLM-L6-v2 in the seed paper), and the
reasoning text that gets embedded."""

from __future__ import annotations

import re

import numpy as np

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_TAG = re.compile(r"</?think>")


def reasoning_text(text: str | None) -> str | None:
    """The reasoning state r_i as the seed embeds it: the content of the last complete
    ``<think>...</think>`` block when there is one, else the text without think tags; ``None`` if empty."""
    if text is None:
        return None
    blocks = _THINK.findall(text)
    out = (blocks[-1] if blocks else _TAG.sub("", text)).strip()
    return out or None


def cosine(u: np.ndarray | None, v: np.ndarray | None) -> float | None:
    """Cosine of two vectors; ``None`` when either is missing or has zero norm."""
    if u is None or v is None:
        return None
    u, v = np.asarray(u, dtype=float), np.asarray(v, dtype=float)
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    if norm == 0.0:
        return None
    return float(np.dot(u, v) / norm)
