"""Synthetic run directories for the tests of the later stages (predictors, stopping sweeps, Stop-RAG).

:func:`write_run`: iterations, trajectories and features with planted signal. P_i follows a bounded random
walk per question. Some signals carry information about P_i or U_i (probe_conf about P_i, probe_conf_delta
and rbo_prevmax_3 about U_i, and the reasoning text says "good"/"bad"), the rest is noise, so a working
pipeline finds positive correlations and a broken one does not. Documents are ``doc<j>`` with title ``T<j>``
and text ``text <j>`` (:func:`doc_lookup`).

:func:`write_stoprag_run`: iterations and trajectories shaped like the probe job's over real bundled
questions and corpus documents (optionally predictions), for the Stop-RAG stage.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from raypipe.core.rundir import RunDir
from raypipe.core.schema import FEATURE_COLUMNS, STOP_ANSWER, conform
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus, load_questions

FILLER = "the river castle novel author born city war king album film band queen bridge island painter".split()


def doc_lookup(doc_id: str) -> tuple[str, str] | None:
    if not doc_id.startswith("doc"):
        return None
    j = doc_id[3:]
    return f"T{j}", f"text {j}"


def write_run(
    path: str | Path, n_questions: int = 60, max_iterations: int = 4, seed: int = 0, prefix: str = "q"
) -> RunDir:
    """``n_questions`` questions with qids ``<prefix>0``, ``<prefix>1``, ... (two runs with other prefixes share
    none)."""
    rng = np.random.default_rng(seed)
    run = RunDir(path)
    trajectories, iterations, features = [], [], []
    for q in range(n_questions):
        qid, dataset = f"{prefix}{q}", ("hotpotqa", "musique")[q % 2]
        n_iter = int(rng.integers(1, max_iterations + 1))
        f1, prev_f1, prev_conf = float(rng.uniform(0, 0.5)), None, None
        for i in range(n_iter + 1):
            if i > 0:
                f1 = float(np.clip(f1 + rng.normal(0.1, 0.3), 0, 1))
            util = None if prev_f1 is None else f1 - prev_f1
            conf = -2 + 2 * f1 + rng.normal(0, 0.3)
            word = "good" if f1 > 0.5 else "bad"
            filler = " ".join(FILLER[int(k)] for k in rng.integers(0, len(FILLER), 40))  # realistic text length
            iterations.append(
                {
                    "qid": qid,
                    "dataset": dataset,
                    "iteration": i,
                    "query": None if i == 0 else f"query {q} {i}",
                    "doc_ids": [] if i == 0 else [f"doc{q * 10 + i}", f"doc{q * 10 + i + 1}"],
                    "doc_scores": [] if i == 0 else [0.9, 0.8],
                    "reasoning": f"step {i} looks {word}. {filler}",
                    "probe_answer": "a",
                    "probe_token_logprobs": [conf],
                    "probe_f1": f1,
                    "utility": util,
                    "tokens_generated": 10,
                    "probe_tokens": 1,
                }
            )
            row = {"qid": qid, "dataset": dataset, "iteration": i, "probe_f1": f1, "utility": util}
            row.update({c: (None if i == 0 else float(rng.normal())) for c in FEATURE_COLUMNS})
            row["probe_conf"] = conf
            row["probe_conf_delta"] = None if prev_conf is None else conf - prev_conf
            if i > 0:
                row["rbo_prevmax_3"] = (util or 0.0) + float(rng.normal(0, 0.1))
            features.append(row)
            prev_f1, prev_conf = f1, conf
        trajectories.append(
            {
                "qid": qid,
                "dataset": dataset,
                "question": f"question number {q}?",
                "golden_answers": ["a"],
                "final_answer": "a",
                "final_f1": f1,
                "n_iterations": n_iter,
                "stop_reason": STOP_ANSWER,
                "error": None,
                "tokens_generated": 10 * (n_iter + 1),
                "probe_tokens": n_iter + 1,
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run.write_part("trajectories", conform(trajectories, "trajectories"), "part-0")
    run.write_part("iterations", conform(iterations, "iterations"), "part-0")
    run.write_part("features", conform(features, "features"), "part-0")
    return run


def write_stoprag_run(
    path: str | Path, n_questions: int = 30, seed: int = 0, max_iterations: int = 4, predictions: bool = False
) -> RunDir:
    """A run directory with ITERATIONS/TRAJECTORIES tables shaped like the probe job's: real bundled
    questions and corpus documents, random trajectories whose probe F1 tends to rise and stay."""
    rng = random.Random(seed)
    questions = load_questions("hotpotqa", limit=n_questions)
    doc_ids = [p.doc_id for _, p in zip(range(2000), iter_corpus(BUNDLED_CORPUS))]
    its, trajs = [], []
    for q in questions:
        n = rng.randint(0, max_iterations)
        f1, rows = 0.0, []
        for i in range(n + 1):
            if i and rng.random() < 0.4:
                f1 = rng.choice([0.5, 1.0]) if f1 < 1.0 or rng.random() < 0.3 else f1
            rows.append(
                {
                    "qid": q.qid,
                    "dataset": q.dataset,
                    "iteration": i,
                    "query": None if i == 0 else f"query {i} for {q.qid}",
                    "doc_ids": [] if i == 0 else rng.sample(doc_ids, 5),
                    "doc_scores": [] if i == 0 else [0.9, 0.8, 0.7, 0.6, 0.5],
                    "reasoning": f"thinking {i}",
                    "probe_answer": q.golden_answers[0] if f1 == 1.0 else "something",
                    "probe_token_logprobs": [-0.1],
                    "probe_f1": f1,
                    "utility": None if i == 0 else f1 - rows[-1]["probe_f1"],
                    "tokens_generated": 40,
                    "probe_tokens": 5,
                }
            )
        its += rows
        trajs.append(
            {
                "qid": q.qid,
                "dataset": q.dataset,
                "question": q.question,
                "golden_answers": q.golden_answers,
                "final_answer": rows[-1]["probe_answer"],
                "final_f1": rows[-1]["probe_f1"],
                "n_iterations": n,
                "stop_reason": "answer",
                "error": None,
                "tokens_generated": 40 * (n + 1),
                "probe_tokens": 5 * (n + 1),
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run = RunDir(path)
    run.write_part("iterations", conform(its, "iterations"), "part-0")
    run.write_part("trajectories", conform(trajs, "trajectories"), "part-0")
    if predictions:  # noisy P̂/Û around the truth, as the predictors would write them; a few questions lack them
        skipped = {q.qid for q in questions[::4]}
        preds = [
            {
                "qid": r["qid"],
                "dataset": r["dataset"],
                "iteration": r["iteration"],
                "fold": 0,
                "feature_group": "g",
                "window": 1,
                "p_hat": r["probe_f1"] + rng.gauss(0, 0.1),
                "u_hat": r["utility"] + rng.gauss(0, 0.1),
                "probe_f1": r["probe_f1"],
                "utility": r["utility"],
            }
            for r in its
            if r["iteration"] > 0 and r["qid"] not in skipped
        ]
        run.write_part("predictions", conform(preds, "predictions"), "part-0")
    return run
