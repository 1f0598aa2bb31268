"""The features stage: the Ray pipeline on a synthetic run whose trajectories straddle input files."""

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.core.schema import FEATURE_COLUMNS, FEATURES
from raypipe.features.extract import extract_trajectory
from raypipe.features.resources import SbertEncoder
from raypipe.stages.features import FeatureStage, pack_trajectory, run_features
from raypipe.testing.synthetic import HashEncoder, synthetic_corpus, write_synthetic_run


def expected_rows(run, config):
    """The pure extractor, trajectory by trajectory, in this process."""
    by_qid = defaultdict(list)
    for row in run.read("iterations").to_pylist():
        by_qid[row["qid"]].append(row)
    trajectories = run.read("trajectories")
    questions = dict(zip(trajectories.column("qid").to_pylist(), trajectories.column("question").to_pylist()))
    corpus, encoder = synthetic_corpus(), HashEncoder()
    out = {}
    for qid, rows in by_qid.items():
        for feats in extract_trajectory(rows, questions[qid], corpus, encoder, config.features):
            out[(qid, feats["iteration"])] = feats
    return out


@pytest.mark.slow
def test_ray_stage_matches_the_pure_extractor_across_file_boundaries(ray_local, tmp_path):
    run = write_synthetic_run(tmp_path / "run", n_questions=12, parts=2)
    files = sorted(run.table_dir("iterations").glob("*.parquet"))
    qids = [set(pq.read_table(p).column("qid").to_pylist()) for p in files]
    assert qids[0] & qids[1], "the fixture must cut a trajectory across the two files"
    stale = run.table_dir("features")
    stale.mkdir(parents=True)
    pq.write_table(pa.table({"old": [1]}), stale / "old.parquet")

    config = load_config("embedded", ["features.actors=2"])
    rows = run_features(run, config, corpus_factory=synthetic_corpus, sentence_factory=HashEncoder)

    assert not (stale / "old.parquet").exists()  # a rerun replaces the table
    table = run.read("features")
    assert table.schema.equals(FEATURES, check_metadata=False)
    assert rows == table.num_rows == run.read("iterations").num_rows
    got = {(r["qid"], r["iteration"]): r for r in table.to_pylist()}
    expected = expected_rows(run, config)
    assert got.keys() == expected.keys()
    for key, row in expected.items():
        assert got[key]["probe_f1"] == pytest.approx(row["probe_f1"])
        for name in FEATURE_COLUMNS:
            assert got[key][name] == pytest.approx(row[name]), (key, name)


def test_missing_inputs_name_the_producer(tmp_path):
    with pytest.raises(RunDirError, match="jobs/probe.py"):
        run_features(RunDir(tmp_path / "empty"), load_config("embedded"), synthetic_corpus, HashEncoder)


def test_pack_and_stage_on_one_batch(tmp_path):
    run = write_synthetic_run(tmp_path / "run", n_questions=3, parts=1)
    iterations = run.read("iterations")
    groups = [iterations.filter(pa.compute.equal(iterations.column("qid"), f"syn-{i}")) for i in range(3)]
    packed = pa.concat_tables([pack_trajectory(g) for g in groups])
    assert packed.column("qid").to_pylist() == ["syn-0", "syn-1", "syn-2"]
    stage = FeatureStage({"syn-0": "a question?"}, synthetic_corpus, HashEncoder)
    out = stage(packed)
    assert out.schema.equals(FEATURES) and out.num_rows == iterations.num_rows
    assert out.column("rbo_question_3").to_pylist()[: groups[0].num_rows][1] is not None  # syn-0 has a question
    assert set(out.filter(pa.compute.equal(out.column("qid"), "syn-1")).column("rbo_question_3").to_pylist()) == {None}


def test_iterations_without_the_needed_columns_are_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    write_synthetic_run(run.path, n_questions=1, parts=1)
    pq.write_table(pa.table({"qid": ["q"], "iteration": [0]}), run.table_dir("iterations") / "part-0.parquet")
    with pytest.raises(ValueError, match="lacks columns"):
        run_features(run, load_config("embedded"), synthetic_corpus, HashEncoder)


def test_sbert_encoder_is_minilm():
    vectors = SbertEncoder("minilm").encode(["who wrote hamlet", "hamlet author", "the boiling point of water"])
    assert vectors.shape == (3, 384)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2]


@pytest.mark.slow
def test_features_through_the_retrieval_service_equal_an_in_process_index(ray_local, tmp_path):
    """No features actor opens the index: vectors, frequencies and the question's list come from the
    service's replicas, and the features equal those over the same index opened in this process."""
    import json

    from raypipe.features.resources import IndexCorpus
    from raypipe.runtime.index_build import ensure_index
    from raypipe.testing.synthetic import _doc_text

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"doc{j}", "contents": f'"T{j}"\n{_doc_text(j)}'}) + "\n" for j in range(200))
    )
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.index.dir={tmp_path / 'idx'}",
            "retrieval.encoder=hash:32",
            "features.actors=1",
            "retrieval.actors.replicas=2",
        ],
    )
    ensure_index(config, use_ray=False)
    run = write_synthetic_run(tmp_path / "run", n_questions=5, deep_k=20, n_docs=200, parts=2)
    rows = run_features(run, config, sentence_factory=HashEncoder)
    assert rows == run.read("iterations").num_rows
    local = IndexCorpus.open(config)
    trajectories = run.read("trajectories")
    questions = dict(zip(trajectories.column("qid").to_pylist(), trajectories.column("question").to_pylist()))
    by_qid = defaultdict(list)
    for row in run.read("iterations").to_pylist():
        by_qid[row["qid"]].append(row)
    got = {(r["qid"], r["iteration"]): r for r in run.read("features").to_pylist()}
    checked = 0
    for qid, its in by_qid.items():
        for feats in extract_trajectory(its, questions[qid], local, HashEncoder(), config.features):
            for name in FEATURE_COLUMNS:
                assert got[(qid, feats["iteration"])][name] == pytest.approx(feats[name]), (qid, name)
            checked += feats["nqc_seed"] is not None and feats["rbo_question_3"] is not None
    assert checked > 0  # the index-backed signals (IDF, the question's own list) were computed
