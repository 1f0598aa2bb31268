"""Passage encoding on CPU: one passage per ONNX call (raypipe's encoder) against padded batches.

    python benchmarks/encoding.py [--passages 1000] [--batch 64]

Encodes the same random bundled passages, one thread, with torch fp32 (sentence-transformers), and
with the ONNX model in fp32 and int8, each both in batches sorted by tokens (what the encoder did
before) and one passage per call (what it does now); prints passages per CPU-second of this process
and the cosine of each vector to torch fp32's. Dynamic int8 quantises activations per call, so only
one passage per call gives a vector that does not depend on its neighbours.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus
from raypipe.retrieval.encoders import EncoderSpec, OnnxEncoder, passage_text


def padded_batches(encoder: OnnxEncoder, texts: list[str], quantization: str, size: int) -> np.ndarray:
    """The alternative: passages sorted by tokens, padded batches of ``size`` per ONNX call."""
    session = encoder._session(quantization)
    ids = encoder.tokenizer(
        [encoder.passage_prefix + t for t in texts], truncation=True, max_length=encoder.spec.max_length
    )["input_ids"]
    order = np.argsort(-np.asarray([len(x) for x in ids]), kind="stable")
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    for start in range(0, len(texts), size):
        rows = order[start : start + size]
        input_ids = np.zeros((len(rows), len(ids[rows[0]])), dtype=np.int64)
        for j, i in enumerate(rows):
            input_ids[j, : len(ids[i])] = ids[i]
        out[rows] = session.run(None, {"input_ids": input_ids, "attention_mask": (input_ids != 0).astype(np.int64)})[0]
    return out


def timed(fn) -> tuple[float, np.ndarray]:
    start = time.process_time()
    vectors = fn()
    return time.process_time() - start, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64, help="passages per padded batch")
    args = parser.parse_args()
    passages = list(iter_corpus(BUNDLED_CORPUS))
    random.Random(0).shuffle(passages)
    texts = [passage_text(p.title, p.text) for p in passages[: args.passages]]
    rows = [
        ("torch fp32 (sentence-transformers)", *timed(lambda: EncoderSpec(threads=1).load().encode_passages(texts)))
    ]
    reference = rows[0][2]
    for quantization in ("none", "int8"):
        encoder = EncoderSpec(backend="onnx", quantization=quantization, threads=1).load()
        encoder._encode(texts[:4], encoder.passage_prefix, quantization)  # load the session before timing
        name = "fp32" if quantization == "none" else quantization
        rows.append(
            (
                f"ONNX {name}, padded batches of {args.batch}",
                *timed(lambda: padded_batches(encoder, texts, quantization, args.batch)),  # noqa: B023 - timed here
            )
        )
        rows.append(
            (
                f"ONNX {name}, one passage per call (raypipe)",
                *timed(lambda: encoder._encode(texts, encoder.passage_prefix, quantization)),  # noqa: B023
            )
        )
    print(f"\n{len(texts)} random bundled passages, 1 thread\n")
    print("| passage encoder | passages per CPU-second | cosine to torch fp32, mean (min) |\n|---|---|---|")
    for name, cpu_s, vectors in rows:
        cosine = (vectors * reference).sum(1)
        print(f"| {name} | {len(texts) / cpu_s:.1f} | {cosine.mean():.4f} ({cosine.min():.3f}) |")


if __name__ == "__main__":
    main()
