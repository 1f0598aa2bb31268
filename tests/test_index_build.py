"""The streaming index build without Ray: the hash stand-in encoder, blocks, resume, equality with a
one-shot build, duplicate ids, and memory-mapped serving."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from raypipe.core.config import load_config
from raypipe.data.loaders import BUNDLED_CORPUS, DataError, iter_corpus
from raypipe.retrieval import EncoderSpec, IndexSettings, LocalRetriever, encoder_spec, load_index_dir, passage_text
from raypipe.retrieval import build as build_module
from raypipe.retrieval.index import build_faiss, read_faiss
from raypipe.retrieval.store import LEXICONS, CorpusStats
from raypipe.runtime.index_build import ensure_index

N = 45


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        lines = [next(src) for _ in range(N)]
    lines.insert(10, "\n")  # a blank line is not a row
    path.write_text("".join(lines))
    return path


def config_for(corpus, index_dir, *extra):
    return load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.index.dir={index_dir}",
            "retrieval.encoder=hash:32",
            "retrieval.encode.block_rows=10",
            *extra,
        ],
    )


def test_hash_encoder_is_deterministic_unit_and_prefix_sensitive():
    spec = EncoderSpec("hash:48")
    enc = spec.load()
    a = enc.encode_passages(["some text", "other text", "some text"])
    assert a.shape == (3, 48) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-6)
    assert np.array_equal(a[0], a[2]) and abs(a[0] @ a[1]) < 0.6
    assert np.array_equal(EncoderSpec("hash:48").load().encode_passages(["some text"])[0], a[0])  # a fresh encoder
    assert (spec.name, spec.dimension(), spec.prompts(), spec.resolved_backend) == ("hash-48", 48, ("", ""), "hash")
    e5 = EncoderSpec("hash:48", prefixes="e5").load()
    assert e5.encode_passages(["some text"])[0] @ a[0] < 0.6  # "passage: some text" is another text
    assert np.array_equal(e5.encode_queries(["x"])[0], enc.encode_passages(["query: x"])[0])
    with pytest.raises(ValueError, match="hash:DIM"):
        EncoderSpec("hash:big").dimension()
    with pytest.raises(ValueError, match="no int8"):
        EncoderSpec("hash:8", quantization="int8").resolved_quantization  # noqa: B018 - the property raises


def test_blocks_cover_the_corpus_in_order(corpus):
    blocks = build_module.plan_blocks(corpus, 10)
    assert [b.n_rows for b in blocks] == [10, 10, 10, 10, 5]
    assert [b.start for b in blocks] == [0, 10, 20, 30, 40]
    read = [row for b in blocks for row in build_module.read_block(corpus, b)[0].column("doc_id").to_pylist()]
    assert read == [p.doc_id for p in iter_corpus(corpus)]
    assert blocks[1].first_lineno == 12  # block 0 spans the blank line 11


def test_build_equals_corpus_order_encoding(corpus, tmp_path):
    """The previous build's result, computed directly: rows in corpus order, each row its passage's vector."""
    config = config_for(corpus, tmp_path / "idx")
    idx = load_index_dir(ensure_index(config, use_ray=False))
    passages = list(iter_corpus(corpus))
    assert idx.docs.table.column("doc_id").to_pylist() == [p.doc_id for p in passages]
    expected = encoder_spec(config.retrieval).load().encode_passages([passage_text(p.title, p.text) for p in passages])
    assert np.array_equal(idx.vectors(range(N)), expected)
    assert idx.manifest["count"] == idx.stats.n_docs == N and idx.manifest["build"]["blocks"] == 5
    counted = CorpusStats.count(passages)  # the blocks' frequencies, merged, equal counting all at once
    for lexicon in LEXICONS:
        assert idx.stats.tables[lexicon].table.equals(counted.tables[lexicon].table, check_metadata=True)
    assert idx.docs.rows_of(["p44", "p3"]) == [44, 3]
    with pytest.raises(KeyError):
        idx.docs.row_of("nope")


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_minilm_build_equals_corpus_order_encoding(corpus, tmp_path, quantization):
    """The embedded encoder, fp32 (the default) and int8: whatever the blocks (20 rows here, longest first
    inside each), every row is its passage's vector encoded alone in corpus order, bit for bit, because the
    ONNX encoder runs one passage per call (int8's dynamic quantisation is per call)."""
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.index.dir={tmp_path / 'idx'}",
            f"retrieval.encoder_quantization={quantization}",
            "retrieval.encode.block_rows=20",
        ],
    )
    idx = load_index_dir(ensure_index(config, use_ray=False))
    passages = list(iter_corpus(corpus))
    texts = [passage_text(p.title, p.text) for p in passages]
    expected = EncoderSpec(quantization=quantization).load().encode_passages(texts)
    assert idx.docs.table.column("doc_id").to_pylist() == [p.doc_id for p in passages]
    assert np.array_equal(idx.vectors(range(N)), expected)


class Interrupted(Exception):
    pass


def test_interrupted_build_resumes_and_equals_an_uninterrupted_one(corpus, tmp_path):
    whole = load_index_dir(ensure_index(config_for(corpus, tmp_path / "whole"), use_ray=False))
    config = config_for(corpus, tmp_path / "resumed")
    encoded = []

    def dies_after_two(spec, path, blocks):
        for i, block in enumerate(build_module.local_encode_blocks(spec, path, blocks)):
            if i == 2:
                raise Interrupted()
            yield block

    def counting(spec, path, blocks):
        encoded.extend(b.index for b in blocks)
        yield from build_module.local_encode_blocks(spec, path, blocks)

    target = tmp_path / "resumed"
    from raypipe.retrieval.index import expected_manifest, file_sha256

    manifest = expected_manifest(
        encoder_spec(config.retrieval), build_module.index_settings(config.retrieval), corpus, file_sha256(corpus)
    )
    with pytest.raises(Interrupted):
        build_module.build_index(config, target, manifest, encode=dies_after_two)
    blocks = tmp_path / ".resumed.build" / "blocks"
    assert not target.exists() and len(list(blocks.glob("*.npy"))) == 2
    # a block written before the Terrier lexicon existed: (term, df) of the plain lexicon only
    plain = pa.ipc.open_file(str(blocks / "000001.df.arrow")).read_all()
    plain = plain.filter(pc.equal(plain.column("lexicon"), "plain")).select(["term", "df"])
    with pa.OSFile(str(blocks / "000001.df.arrow"), "wb") as sink, pa.ipc.new_file(sink, plain.schema) as writer:
        writer.write_table(plain)
    build_module.build_index(config, target, manifest, encode=counting)
    assert encoded == [2, 3, 4]  # only the blocks not written before
    resumed = load_index_dir(target)
    assert resumed.manifest["build"]["passages_encoded"] == 25
    assert (target / "index.faiss").read_bytes() == (tmp_path / "whole" / "index.faiss").read_bytes()
    assert resumed.docs.table.equals(whole.docs.table)
    for lexicon in LEXICONS:
        assert resumed.stats.tables[lexicon].table.equals(whole.stats.tables[lexicon].table, check_metadata=True)


def test_a_plan_for_other_settings_is_discarded(corpus, tmp_path):
    config = config_for(corpus, tmp_path / "idx")
    work = tmp_path / ".idx.build"
    (work / "blocks").mkdir(parents=True)
    (work / "plan.json").write_text(json.dumps({"build": {}, "block_rows": 10, "blocks": []}))
    (work / "blocks" / "000000.npy").write_bytes(b"stale")
    idx = load_index_dir(ensure_index(config, use_ray=False))
    assert idx.manifest["build"]["passages_encoded"] == N


def test_chunked_ivf_equals_a_one_shot_build():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    settings = IndexSettings("ivf", ivf_nlist=4)
    one, _ = build_faiss(x, settings)
    from raypipe.retrieval.index import build_faiss_chunked

    chunked, factory = build_faiss_chunked(
        lambda: (x[i : i + 70] for i in range(0, 400, 70)), 400, 16, settings, sample=lambda rows: x[rows]
    )
    one.nprobe = chunked.nprobe = 4
    assert factory == "IVF4,Flat"
    assert np.array_equal(one.search(x[:20], 5)[1], chunked.search(x[:20], 5)[1])


def test_duplicate_ids_across_blocks_name_both_rows(tmp_path):
    path = tmp_path / "dup.jsonl"
    rows = [{"id": f"d{i}", "contents": f'"T{i}"\ntext {i}'} for i in range(12)]
    rows[11]["id"] = "d2"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="duplicate passage id 'd2' \\(corpus rows 2 and 11\\)"):
        ensure_index(config_for(path, tmp_path / "idx", "retrieval.encode.block_rows=5"), use_ray=False)


def test_serving_maps_the_doc_store_and_the_flat_index(corpus, tmp_path):
    config = config_for(corpus, tmp_path / "idx")
    path = ensure_index(config, use_ray=False)
    before = pa.total_allocated_bytes()
    retriever = LocalRetriever.open(path, encoder_spec(config.retrieval), build_module.search_params(config.retrieval))
    assert pa.total_allocated_bytes() - before < 10_000  # docs.arrow is mapped, not copied into Arrow's pool
    stats = load_index_dir(path).stats
    assert stats.df("the") > 0 and stats.df("zzz", "terrier") == 0
    assert pa.total_allocated_bytes() - before < 10_000  # so are the lexicon tables
    maps = open("/proc/self/maps").read()
    assert str(path / "index.faiss") in maps and str(path / "docs.arrow") in maps
    assert str(path / "df_plain.arrow") in maps and str(path / "df_terrier.arrow") in maps
    doc = retriever.docs.get([7])[0]
    [result] = retriever.search_batch([f'"{doc.title}"\n{doc.text}'], 2)  # hash: only the same text is close
    assert result.hits[0].doc_id == doc.doc_id and result.hits[0].score == pytest.approx(1.0, abs=1e-5)
    read = read_faiss(path / "index.faiss", mapped=False)
    assert np.array_equal(read.reconstruct(3), retriever.index.reconstruct(3))
