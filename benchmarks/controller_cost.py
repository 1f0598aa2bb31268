"""The online controller's cross-encoder forward on this CPU: torch against ONNX Runtime, one trajectory per call
against batches of the trajectories waiting on a decision.

    python benchmarks/controller_cost.py                   # the embedded cross-encoder's size, about 1 min on 2 cores
    python benchmarks/controller_cost.py --threads 1 --batches 1 4 16 --repeats 20

The model is the embedded cross-encoder's architecture (``train.base_model``, MiniLM, with the relation's marker
tokens and a regression head; its weights are untrained: the cost does not depend on them), saved to a temporary
folder and exported to ONNX in a temporary cache. Inputs are intra-iteration relation texts cut as the embedded
preset cuts them (``train.field_chars``/``title_chars``, ``train.max_tokens``) from the bundled corpus. For each
backend and batch size B the table shows the median seconds of one call scoring B texts and the seconds per
trajectory (call / B), over ``--repeats`` calls after one untimed call. Prints the CPU first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

from raypipe.core.config import load_config
from raypipe.core.machine import cpu_description
from raypipe.data.loaders import iter_corpus
from raypipe.predict.relations import IterationText, format_relation


def relation_texts(n: int, field_chars: int, title_chars: int) -> list[str]:
    passages = list(itertools.islice(iter_corpus(), n))
    return [
        format_relation(
            "intra_iteration",
            IterationText(
                question=f"Which film did the director of {p.title} make first?",
                reasoning=f"I need to find out about {p.title} and its director. " + p.text[:80],
                query=f"{p.title} director",
                first_reasoning="",
                prev_reasoning="",
                prev_query="",
                top_title=p.title,
                top_text=p.text,
            ),
            field_chars,
            title_chars,
        )
        for p in passages
    ]


def timed(score, texts: list[str], max_tokens: int, repeats: int) -> float:
    score(texts, max_tokens)  # untimed: first-call allocations
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        score(texts, max_tokens)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads (default: theirs)")
    args = parser.parse_args()
    import torch

    from raypipe.core.models import resolve_sentence_model
    from raypipe.predict.crossencoder import new_crossencoder
    from raypipe.predict.scorers import OnnxScorer, TorchScorer

    if args.threads:
        torch.set_num_threads(args.threads)
    model_name, flags, cores = cpu_description()
    print(f"CPU: {model_name} ({cores} logical cores; {flags})")
    train = load_config().train
    texts = relation_texts(max(args.batches), train.field_chars, train.title_chars)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAYPIPE_CACHE"] = str(Path(tmp) / "cache")
        folder = Path(tmp) / "crossencoder"
        new_crossencoder(str(resolve_sentence_model(train.base_model)), "intra_iteration", dropout=0.0).save(
            str(folder)
        )
        scorers = {
            "torch": TorchScorer(folder, batch_size=max(args.batches)),
            "onnx": OnnxScorer(folder, batch_size=max(args.batches), threads=args.threads),
        }
        print(
            f"\n{train.base_model} cross-encoder, max_tokens {train.max_tokens}, threads {args.threads or 'default'}\n"
        )
        print("| backend | B | s per call | ms per trajectory |")
        print("|---|---|---|---|")
        for name, scorer in scorers.items():
            for b in args.batches:
                call = timed(scorer.score, texts[:b], train.max_tokens, args.repeats)
                print(f"| {name} | {b} | {call:.4f} | {1000 * call / b:.1f} |")


if __name__ == "__main__":
    main()
