"""Cosine similarity between sentence embeddings (SBERT all-MiniLM-L6-v2 in the seed paper), and the
reasoning text r_i that the similarities and the cross-encoders read."""

from __future__ import annotations

import re
from typing import Literal

import numpy as np

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ACTIONS = ("<search>", "<|begin_of_query|>", "<answer>")  # a turn's reasoning ends where its action begins


def reasoning_text(text: str | None, mode: Literal["parsed", "raw"] = "parsed") -> str | None:
    """r_i of one turn's output (``ITERATIONS.reasoning``); ``None`` when nothing is left.

    ``parsed`` (the default) is the seed's parsing (DanielTian97/agentic_rag_predictions
    ``predictions/unsupervised/semantic_similarity.py``), applied to one turn:

    - Search-R1 (``_extract_search_r1_reasoning``, lines 95-131): the last complete
      ``<think>...</think>`` block of the turn; a turn without one has no reasoning ("" there);
    - R1-Searcher (``_extract_r1_searcher_reasoning``, lines 134-154; its prompt opens ``<think>``):
      the turn's text up to its ``<|begin_of_query|>`` span and up to ``</think>``.

    Either way the search action, the query markup and a final answer are not part of r_i. A turn
    whose action is ``<search>`` is read as Search-R1's, one with ``<|begin_of_query|>`` as
    R1-Searcher's; an answer turn by whether it holds a complete think block. ``raw``: the turn's
    whole output, stripped.
    """
    if text is None:
        return None
    if mode == "raw":
        return text.strip() or None
    cut = min((i for i in (text.find(tag) for tag in _ACTIONS) if i >= 0), default=len(text))
    head = text[:cut]
    blocks = _THINK_BLOCK.findall(head)
    if blocks:
        out = blocks[-1]
    elif "<think>" in head or text.startswith("<search>", cut):
        out = ""  # Search-R1 without a complete think block
    else:
        out = head.split("</think>", 1)[0]
    return out.strip() or None


def cosine(u: np.ndarray | None, v: np.ndarray | None) -> float | None:
    """Cosine of two vectors; ``None`` when either is missing or has zero norm."""
    if u is None or v is None:
        return None
    u, v = np.asarray(u, dtype=float), np.asarray(v, dtype=float)
    norm = float(np.linalg.norm(u) * np.linalg.norm(v))
    if norm == 0.0:
        return None
    return float(np.dot(u, v) / norm)
