"""``raypipe index --import-faiss``: an existing FAISS index over a corpus file, in the published format
(a faiss IndexFlatIP written with faiss.write_index; a jsonl corpus of {"id", "contents"}), becomes an
index directory without re-encoding; and a probe run uses it."""

import json
import sys

import faiss
import numpy as np
import pytest

from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import Question, iter_corpus
from raypipe.retrieval import EncoderSpec, IndexMismatchError, LocalRetriever, load_index_dir
from raypipe.retrieval.import_faiss import ImportVerificationError, import_faiss
from raypipe.retrieval.store import LEXICONS, CorpusStats
from raypipe.runtime.index_build import ensure_index
from raypipe.stages import index as index_stage
from raypipe.testing.fakes import FakeEngine

N = 30
DIM = 32


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A corpus and the flat IP index of its passages encoded with hash:32 with E5 prefixes
    ("passage: " + contents, as Search-R1's index of wiki-18 with e5-base-v2)."""
    root = tmp_path_factory.mktemp("published")
    rows = [{"id": str(i), "contents": f'"Title {i}"\npassage number {i} about topic {i % 7}'} for i in range(N)]
    corpus = root / "wiki.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    vectors = EncoderSpec(f"hash:{DIM}", prefixes="e5").load().encode_passages([r["contents"] for r in rows])
    write_flat(root / "e5_Flat.index", vectors)
    return corpus, root / "e5_Flat.index", vectors


def write_flat(path, vectors):
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


def e5_hash(prefixes="e5"):
    return EncoderSpec(f"hash:{DIM}", prefixes=prefixes)


def test_good_import_records_the_source_and_searches(published, tmp_path):
    corpus, index_file, vectors = published
    out = import_faiss(index_file, corpus, e5_hash(), tmp_path / "imported", block_rows=8, sample=10)
    idx = load_index_dir(out, e5_hash())
    imported = idx.manifest["import"]
    assert imported["verified"] is True and imported["sample_rows"] == 10
    assert imported["cosine_min"] == pytest.approx(1.0, abs=1e-6)
    assert imported["source_bytes"] == index_file.stat().st_size and len(imported["source_sha256"]) == 64
    assert idx.manifest["count"] == N and idx.manifest["factory"] == "Flat" and idx.stats.n_docs == N
    assert idx.docs.table.column("doc_id").to_pylist() == [str(i) for i in range(N)]
    counted = CorpusStats.count(iter_corpus(corpus))  # both lexicons, merged from blocks of 8
    assert all(idx.stats.tables[lex].table.equals(counted.tables[lex].table, check_metadata=True) for lex in LEXICONS)
    assert np.array_equal(idx.vectors([5]), vectors[5:6])
    retriever = LocalRetriever.open(out, e5_hash())
    row = retriever.index.search(vectors[9:10], 1)[1][0][0]
    assert retriever.docs.get([int(row)])[0].doc_id == "9"
    # the probe's ensure_index over the same settings takes the imported directory as it is
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.encoder=hash:{DIM}",
            "retrieval.encoder_prefixes=e5",
            f"retrieval.index.dir={out}",
        ],
    )
    assert ensure_index(config, use_ray=False) == out


def test_wrong_row_count_names_both_counts(published, tmp_path):
    corpus, _, vectors = published
    short = write_flat(tmp_path / "short.index", vectors[:-1])
    with pytest.raises(IndexMismatchError, match=f"has {N - 1} rows, .* has {N} passages"):
        import_faiss(short, corpus, e5_hash(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_wrong_dimension(published, tmp_path):
    corpus, index_file, _ = published
    with pytest.raises(IndexMismatchError, match="dimension 32, the encoder hash-64 gives 64"):
        import_faiss(index_file, corpus, EncoderSpec("hash:64", prefixes="e5"), tmp_path / "out")


def test_wrong_encoder_or_prefix_fails_naming_the_rows(published, tmp_path):
    corpus, index_file, _ = published
    with pytest.raises(ImportVerificationError, match=r"10 of 10 sampled .* row \d+ \(id '\d+'\): cosine"):
        import_faiss(index_file, corpus, e5_hash("none"), tmp_path / "out", sample=10)  # no "passage: " prefix
    other = write_flat(tmp_path / "minilm.index", np.eye(N, 384, dtype=np.float32))
    with pytest.raises(ImportVerificationError, match="minilm"):
        import_faiss(other, corpus, EncoderSpec("minilm", quantization="none"), tmp_path / "out", sample=4)
    assert not (tmp_path / "out").exists()


def test_cli_import_without_verification(published, tmp_path, monkeypatch, capsys):
    corpus, index_file, _ = published
    out = tmp_path / "cli"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "raypipe index",
            "--import-faiss",
            str(index_file),
            "--corpus",
            str(corpus),
            "--encoder",
            "hash:32",
            "--set",
            "retrieval.encoder_prefixes=none",
            "--out",
            str(out),
            "--no-verify",
        ],
    )
    index_stage.main()  # the wrong prefix goes unnoticed without verification: recorded as such
    imported = load_index_dir(out).manifest["import"]
    assert imported["verified"] is False and imported["skipped"] is True and "cosine_min" not in imported
    assert "not verified" in capsys.readouterr().out
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "raypipe index",
            "--import-faiss",
            str(index_file),
            "--corpus",
            str(corpus),
            "--encoder",
            "hash:48",
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    with pytest.raises(SystemExit, match="error: .*dimension 32"):
        index_stage.main()


def search_then_answer(config):
    """Search once with the question, then answer with the first document's id."""

    def script(request):
        if request.prompt.endswith("<answer>"):
            return " done </answer>"
        if "Doc 1(" in request.prompt:
            return "<think> found </think>\n<answer> done </answer>"
        return "<think> look </think>\n<search> passage number 3 </search>"

    return FakeEngine(script)


@pytest.mark.slow
def test_probe_run_over_an_imported_index(published, ray_local, tmp_path):
    from raypipe.stages.probe import run_probe

    corpus, index_file, _ = published
    out = import_faiss(index_file, corpus, e5_hash(), tmp_path / "imported")
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.encoder=hash:{DIM}",
            "retrieval.encoder_prefixes=e5",
            f"retrieval.index.dir={out}",
            "generation.batch_size=2",
            "retrieval.deep_k=5",
        ],
    )
    questions = [
        Question(qid=f"q{i}", dataset="toy", question=f"what is passage {i}?", golden_answers=["done"])
        for i in range(3)
    ]
    run = RunDir(tmp_path / "run")
    assert run_probe(config, run, questions, engine_factory=search_then_answer) == 3
    iterations = run.read("iterations").to_pylist()
    searched = [r for r in iterations if r["doc_ids"]]
    assert searched and all(set(r["doc_ids"]) <= {str(i) for i in range(N)} for r in searched)
    assert all(len(r["doc_ids"]) == 5 for r in searched)  # deep_k lists from the imported index
