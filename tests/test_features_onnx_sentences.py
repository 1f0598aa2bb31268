"""The online controller's sentence encoder on ONNX Runtime gives the similarity signals torch gives."""

import numpy as np

from raypipe.features.resources import OnnxSentenceEncoder, SbertEncoder
from raypipe.features.similarity import cosine

TEXTS = [
    "Who wrote Hamlet?",
    "hamlet author",
    "I need to find the author of the play, then where he was born.",
    "shakespeare birthplace stratford",
    "The river that runs through the town is the Avon, which rises in Northamptonshire " * 8,
]


def test_onnx_cosines_equal_sentence_transformers():
    torch_vectors, onnx_vectors = SbertEncoder().encode(TEXTS), OnnxSentenceEncoder(threads=1).encode(TEXTS)
    pairs = [(i, j) for i in range(len(TEXTS)) for j in range(i + 1, len(TEXTS))]
    reference = np.array([cosine(torch_vectors[i], torch_vectors[j]) for i, j in pairs])
    onnx = np.array([cosine(onnx_vectors[i], onnx_vectors[j]) for i, j in pairs])
    assert np.ptp(reference) > 0.1  # the texts differ: equal cosines would prove nothing
    assert np.abs(onnx - reference).max() < 1e-5
