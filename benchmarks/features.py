"""Throughput of the trajectory-signal stage: feature rows per second.

    python benchmarks/features.py                 # synthetic run (200 questions), synthetic corpus
    python benchmarks/features.py RUN_DIR         # a real run and its retrieval index

Measures, on the same iterations: the pure extractor in this process with a stand-in sentence encoder
(the signal arithmetic alone), with the real sentence model (MiniLM), and the Ray Data job end to end
(read, group by trajectory, actor pool, write; actor start-up included).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections import defaultdict
from functools import partial

from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.features.extract import extract_trajectory
from raypipe.features.resources import IndexCorpus, SbertEncoder
from raypipe.runtime.cluster import init_ray
from raypipe.stages.features import run_features
from raypipe.testing.synthetic import HashEncoder, synthetic_corpus, write_synthetic_run


def pure_rate(run: RunDir, corpus, encoder, settings) -> tuple[int, float]:
    by_qid = defaultdict(list)
    for row in run.read("iterations").to_pylist():
        by_qid[row["qid"]].append(row)
    traj = run.read("trajectories")
    questions = dict(zip(traj.column("qid").to_pylist(), traj.column("question").to_pylist()))
    start = time.perf_counter()
    rows = sum(len(extract_trajectory(r, questions.get(q), corpus, encoder, settings)) for q, r in by_qid.items())
    return rows, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="a run directory (default: a synthetic one)")
    parser.add_argument("--questions", type=int, default=200, help="synthetic run size")
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray job measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    if args.run_dir:
        run = RunDir(args.run_dir)
        config = load_config(run.path / "config.yaml", [f"features.actors={args.actors}"])
        corpus_factory = partial(IndexCorpus.open, config)
    else:
        run = write_synthetic_run(tempfile.mkdtemp(prefix="features-bench-") + "/run", n_questions=args.questions)
        config = load_config("embedded", [f"features.actors={args.actors}"])
        corpus_factory = synthetic_corpus
    settings = config.features
    corpus = corpus_factory()
    results = []
    rows, secs = pure_rate(run, corpus, HashEncoder(), settings)
    results.append(("extractor, stand-in sentence encoder", rows, secs))
    sbert = SbertEncoder(config.features.sentence_model)
    rows, secs = pure_rate(run, corpus, sbert, settings)
    results.append((f"extractor, {config.features.sentence_model} sentence encoder", rows, secs))
    if not args.no_ray:
        import ray

        init_ray(config, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            start = time.perf_counter()
            rows = run_features(run, config, corpus_factory=corpus_factory)
            results.append((f"Ray job ({args.actors} actor(s), start-up included)", rows, time.perf_counter() - start))
        finally:
            ray.shutdown()

    print(f"\nfeatures benchmark on {run.path} ({'real run' if args.run_dir else 'synthetic'})")
    print(f"{'mode':<48} {'rows':>6} {'s':>7} {'rows/s':>8}")
    for mode, rows, secs in results:
        print(f"{mode:<48} {rows:>6} {secs:>7.2f} {rows / secs:>8.1f}")


if __name__ == "__main__":
    main()
