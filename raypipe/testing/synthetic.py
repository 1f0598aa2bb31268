"""A synthetic run directory and matching fake resources, for tests and benchmarks of the features stage.

It ships (rather than living in tests/helpers/) because ``benchmarks/features.py`` runs the features stage on
it, and benchmarks import nothing from ``tests/``.

The run respects the ITERATIONS and TRAJECTORIES schemas (iteration 0 = probe only, null query, empty
lists; later iterations with deep lists that partly repeat earlier ones, some with an empty query and
no retrieval). Texts, vectors and encoders are deterministic functions of a seed and of the text.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raypipe.core.rundir import RunDir
from raypipe.core.schema import STOP_ANSWER, conform
from raypipe.features.resources import InMemoryCorpus

WORDS = (
    "river castle novel author born city war king album film band queen bridge island painter poet "
    "founded league season director actor capital mountain church prize university company ship"
).split()
DIM = 32


def hash_vectors(texts: Sequence[str], dim: int = DIM) -> np.ndarray:
    """A unit vector per text, a deterministic function of the text (a stand-in encoder)."""
    out = np.empty((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        v = np.random.default_rng(zlib.crc32(text.encode())).standard_normal(dim)
        out[i] = v / np.linalg.norm(v)
    return out


class HashEncoder:
    """:class:`~raypipe.features.resources.SentenceEncoder` stand-in."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return hash_vectors(texts)


def _doc_text(j: int) -> str:
    rng = random.Random(j)
    return " ".join(rng.choice(WORDS) for _ in range(12))


def synthetic_corpus(n_docs: int = 500) -> InMemoryCorpus:
    ids = [f"doc{j}" for j in range(n_docs)]
    texts = {d: _doc_text(j) for j, d in enumerate(ids)}
    vectors = dict(zip(ids, hash_vectors([texts[d] for d in ids])))
    return InMemoryCorpus(vectors, texts, hash_vectors)


def write_synthetic_run(
    path: str | Path,
    n_questions: int = 20,
    max_iterations: int = 4,
    deep_k: int = 100,
    n_docs: int = 500,
    seed: int = 0,
    parts: int = 2,
) -> RunDir:
    """Write trajectories/ and iterations/; iteration i goes to file ``i % parts``, so every trajectory
    straddles files."""
    rng = random.Random(seed)
    run = RunDir(path)
    trajectories, iterations = [], []
    for q in range(n_questions):
        qid = f"syn-{q}"
        question = " ".join(rng.choice(WORDS) for _ in range(8)) + "?"
        n_iter = rng.randint(1, max_iterations)
        prev_f1 = None
        previous_list = rng.sample(range(n_docs), deep_k)
        for i in range(n_iter + 1):
            f1 = round(rng.random(), 3)
            no_search = i > 0 and rng.random() < 0.1
            if i == 0 or no_search:
                query, doc_ids, scores = (None if i == 0 else ""), [], []
            else:
                keep = rng.randint(0, deep_k // 2)
                kept = previous_list[:keep]
                ids = kept + [d for d in rng.sample(range(n_docs), deep_k) if d not in kept]
                previous_list = ids[:deep_k]
                query = " ".join(rng.choice(WORDS) for _ in range(4))
                doc_ids = [f"doc{d}" for d in previous_list]
                scores = sorted((rng.uniform(0.2, 0.9) for _ in doc_ids), reverse=True)
            n_tok = rng.randint(0, 12)
            iterations.append(
                {
                    "qid": qid,
                    "dataset": "synthetic",
                    "iteration": i,
                    "query": query,
                    "doc_ids": doc_ids,
                    "doc_scores": scores,
                    "reasoning": " ".join(rng.choice(WORDS) for _ in range(20)),
                    "probe_answer": rng.choice(WORDS),
                    "probe_token_logprobs": [-rng.random() * 3 for _ in range(n_tok)],
                    "probe_f1": f1,
                    "utility": None if prev_f1 is None else f1 - prev_f1,
                    "tokens_generated": 40,
                    "probe_tokens": n_tok,
                }
            )
            prev_f1 = f1
        trajectories.append(
            {
                "qid": qid,
                "dataset": "synthetic",
                "question": question,
                "golden_answers": ["x"],
                "final_answer": "x",
                "final_f1": prev_f1,
                "n_iterations": n_iter,
                "stop_reason": STOP_ANSWER,
                "error": None,
                "tokens_generated": 40 * (n_iter + 1),
                "probe_tokens": 10,
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run.write_part("trajectories", conform(trajectories, "trajectories"), "part-0")
    for p in range(parts):
        chunk = [r for r in iterations if r["iteration"] % parts == p]
        if chunk:
            run.write_part("iterations", conform(chunk, "iterations"), f"part-{p}")
    return run
