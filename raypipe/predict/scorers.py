"""How the predictor bundle runs its trained cross-encoders (:mod:`raypipe.predict.crossencoder`) online.

- ``torch``: the CrossEncoder folder in sentence-transformers / transformers, the reference (what training's
  out-of-fold predictions use, :func:`~raypipe.predict.crossencoder.predict_texts`);
- ``onnx``: the same model exported once to ONNX (its logits; :func:`raypipe.retrieval.encoders.onnx_model_file`,
  the retrieval encoder's export and cache) and run with ONNX Runtime on the CPU, in fp32: its outputs equal
  torch's within 1e-4 (``tests/test_predict_scorers.py``) at a fraction of the cost per call.

Either scores a list of relation texts in padded batches of ``batch_size``, longest first, so a batch of
trajectories waiting on the controller is one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from raypipe.core.config import ControllerBackend


class Scorer(Protocol):
    def score(self, texts: Sequence[str], max_tokens: int) -> np.ndarray: ...


class TorchScorer:
    """The CrossEncoder in torch (the reference)."""

    def __init__(self, folder: Path, batch_size: int):
        from raypipe.predict.crossencoder import load_crossencoder

        self.model, self.batch_size = load_crossencoder(folder), batch_size

    def score(self, texts: Sequence[str], max_tokens: int) -> np.ndarray:
        from raypipe.predict.crossencoder import predict_texts

        return predict_texts(self.model, list(texts), max_tokens, self.batch_size)


class OnnxScorer:
    """The CrossEncoder exported to ONNX (fp32), run with ONNX Runtime on the CPU."""

    def __init__(self, folder: Path, batch_size: int, threads: int | None = None):
        from transformers import AutoTokenizer

        from raypipe.retrieval.encoders import cpu_session, onnx_model_file

        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.session = cpu_session(onnx_model_file(folder, "none", head="score"), threads)
        self.batch_size = batch_size

    def score(self, texts: Sequence[str], max_tokens: int) -> np.ndarray:
        out = np.zeros(len(texts), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenizer(list(texts), truncation=True, max_length=max_tokens)["input_ids"]
        order = np.argsort([-len(t) for t in ids], kind="stable")  # a batch of similar lengths pads little
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = len(ids[rows[0]])
            input_ids = np.full((len(rows), width), self.tokenizer.pad_token_id, dtype=np.int64)
            mask = np.zeros_like(input_ids)
            for k, row in enumerate(rows):
                input_ids[k, : len(ids[row])] = ids[row]
                mask[k, : len(ids[row])] = 1
            out[rows] = self.session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0][:, 0]
        return out


def load_scorer(folder: Path, backend: ControllerBackend, batch_size: int = 64, threads: int | None = None) -> Scorer:
    """The cross-encoder at ``folder`` run by ``backend`` (``threads``: ONNX Runtime's intra-op threads)."""
    return OnnxScorer(folder, batch_size, threads) if backend == "onnx" else TorchScorer(folder, batch_size)
