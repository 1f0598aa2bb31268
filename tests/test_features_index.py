"""The features stage's adapter over a real (tiny) retrieval index directory, and the extractor on it."""

import json

import numpy as np
import pytest

from raypipe.core.config import load_config
from raypipe.features.extract import extract_trajectory
from raypipe.features.resources import IndexCorpus, SbertEncoder
from tests.helpers.index_checks import assert_rows_are_their_passages

PASSAGES = [
    ("p1", "Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("p2", "William Shakespeare", "Shakespeare was an English playwright born in Stratford-upon-Avon."),
    ("p3", "Stratford-upon-Avon", "Stratford-upon-Avon is a market town in Warwickshire, England."),
    ("p4", "Macbeth", "Macbeth is a tragedy by William Shakespeare about a Scottish general."),
    ("p5", "Thames", "The Thames is a river that flows through London."),
    ("p6", "Paris", "Paris is the capital of France."),
]


@pytest.fixture(scope="module")
def index_config(tmp_path_factory):
    from raypipe.runtime.index_build import ensure_index

    root = tmp_path_factory.mktemp("index")
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "contents": f'"{t}"\n{x}'}) + "\n" for i, t, x in PASSAGES))
    config = load_config("embedded", [f"data.corpus={path}", f"retrieval.index.dir={root / 'idx'}", "ray.num_cpus=2"])
    ensure_index(config, use_ray=False)
    return config


@pytest.fixture(scope="module")
def corpus(index_config):
    return IndexCorpus.open(index_config)


@pytest.mark.slow
def test_index_adapter_reads_the_index(corpus):
    from raypipe.retrieval.encoders import passage_text

    assert corpus.num_docs == 6
    assert corpus.terms("Who wrote HAMLET?") == ["who", "wrote", "hamlet"]
    assert corpus.document_frequency("shakespeare") == 3 and corpus.document_frequency("zzz") == 0
    assert corpus.document_frequency("shakespear", "terrier") == 3  # the Terrier lexicon's Porter stem
    assert corpus.document_frequency("shakespeare", "terrier") == corpus.document_frequency("the", "terrier") == 0
    vectors = corpus.doc_vectors(["p2", "p1"])
    encoded = corpus.retriever.encoder.encode_passages([passage_text(*PASSAGES[1][1:]), passage_text(*PASSAGES[0][1:])])
    assert_rows_are_their_passages(vectors, encoded)  # reconstructed from the flat index in the order asked
    assert corpus.search(["capital of France"], 2)[0][0] == "p6"
    assert corpus.encode_queries(["a", "b"]).shape == (2, vectors.shape[1])


@pytest.mark.slow
def test_extractor_end_to_end_on_a_real_index(corpus):
    rows = trajectory_rows(corpus, "q")
    out = extract_trajectory(rows, "Who wrote Hamlet?", corpus, SbertEncoder("minilm"))
    second = out[2]
    for name in (
        "nqc_seed",
        "nqc_shtok",
        "a_pair_ratio",
        "dense_qpp",
        "rbo_prev_3",
        "rbo_question_20",
        "sim_question_query",
        "sim_reasoning_prev",
        "sim_reasoning_first",
    ):
        assert second[name] is not None and np.isfinite(second[name]), name
    assert out[1]["sim_question_query"] > out[2]["sim_question_query"]  # "Hamlet author" is closer
    # "hamlet author": author is unknown (df counts as 1) -> max IDF = log 6
    assert out[1]["nqc_seed"] == pytest.approx(np.var(rows[1]["doc_scores"]) * np.log(6), rel=1e-5)


def trajectory_rows(corpus, qid, f1=(0.0, 1.0, 1.0)):
    hits = corpus.retriever.search_batch(["Hamlet author", "Shakespeare birthplace"], 6)
    return [
        {
            "qid": "q",
            "dataset": "d",
            "iteration": 0,
            "query": None,
            "doc_ids": [],
            "doc_scores": [],
            "reasoning": "I need to find who wrote Hamlet.",
            "probe_token_logprobs": [-0.1] * 6,
            "probe_f1": 0.0,
            "utility": None,
        },
    ] + [
        {
            "qid": "q",
            "dataset": "d",
            "iteration": i + 1,
            "query": r.query,
            "doc_ids": [h.doc_id for h in r.hits],
            "doc_scores": [h.score for h in r.hits],
            "reasoning": f"Step {i + 1}: the documents mention Shakespeare.",
            "probe_token_logprobs": [-0.2] * 6,
            "probe_f1": 1.0,
            "utility": 1.0 if i == 0 else 0.0,
        }
        for i, r in enumerate(hits)
    ]


@pytest.mark.slow
def test_features_job_on_a_run_dir(index_config, corpus, tmp_path):
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    from raypipe.core.rundir import RunDir
    from raypipe.core.schema import FEATURE_COLUMNS, STOP_ANSWER, conform

    run = RunDir(tmp_path / "run")
    iterations, trajectories = [], []
    for n, (qid, f1) in enumerate([("a", (0.0, 0.5, 1.0)), ("b", (0.2, 0.2, 0.0)), ("c", (1.0, 0.0, 0.5))]):
        rows = trajectory_rows(corpus, qid)
        for row, value in zip(rows, f1):
            row.update(
                qid=qid,
                probe_f1=value,
                probe_answer="x",
                tokens_generated=5,
                probe_tokens=6,
                probe_token_logprobs=[-0.1 * (n + 1)] * 6,
            )
        for prev, row in zip(rows, rows[1:]):
            row["utility"] = row["probe_f1"] - prev["probe_f1"]
        iterations += rows
        trajectories.append(
            {
                "qid": qid,
                "dataset": "d",
                "question": "Who wrote Hamlet?",
                "golden_answers": ["x"],
                "final_answer": "x",
                "final_f1": f1[-1],
                "n_iterations": 2,
                "stop_reason": STOP_ANSWER,
                "error": None,
                "tokens_generated": 10,
                "probe_tokens": 18,
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run.write_part("iterations", conform(iterations, "iterations"), "part-0")
    run.write_part("trajectories", conform(trajectories, "trajectories"), "part-0")
    run.write_config(index_config)

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, str(root / "jobs" / "features.py"), str(run.path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert run.read("features").num_rows == 9
    assert "r(P_i)" in done.stdout and "probe_conf" in done.stdout
    with open(run.path / "feature_correlations.csv") as fh:
        table = {r["signal"]: r for r in csv.DictReader(fh)}
    assert list(table) == list(FEATURE_COLUMNS)
    assert table["probe_conf"]["n_P"] == "9" and table["nqc_seed"]["n_P"] == "6"
