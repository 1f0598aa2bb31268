"""Vectors shipped for the bundled corpus (raypipe/retrieval/shipped.py): the file matches its encoder, a
build takes them after a re-encoded sample agrees, and vectors that disagree or were made with other
settings are not used."""

import json
import logging
import shutil

import numpy as np
import pytest

from raypipe.core.config import load_config
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus
from raypipe.retrieval import encoder_spec, load_index_dir
from raypipe.retrieval import shipped as shipped_module
from raypipe.retrieval.build import plan_blocks
from raypipe.retrieval.index import IndexMismatchError, file_sha256
from raypipe.stages.index import ensure_index

N = 40


def config_for(corpus, index_dir, *extra):
    return load_config("embedded", [f"data.corpus={corpus}", f"retrieval.index_dir={index_dir}",
                                    "retrieval.build_block_rows=16", *extra])


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """A small corpus (the bundled corpus's first N passages), its index built by encoding, and its
    vectors exported in the shipped format."""
    work = tmp_path_factory.mktemp("shipped")
    corpus = work / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(N)))
    config = config_for(corpus, work / "encoded", "retrieval.shipped_vectors=false")
    index_dir = ensure_index(config, use_ray=False)
    exported = shipped_module.export_vectors(index_dir, encoder_spec(config.retrieval), work / "vectors", "test")
    return corpus, index_dir, exported


def test_the_bundled_corpus_ships_vectors_its_encoder_reproduces():
    spec = encoder_spec(load_config("embedded", []).retrieval)
    shipped = shipped_module.find_shipped(spec, file_sha256(BUNDLED_CORPUS))
    assert shipped is not None and shipped.path.parent == shipped_module.SHIPPED_DIR
    n = sum(1 for _ in iter_corpus(BUNDLED_CORPUS))
    assert shipped.meta["rows"] == n and np.load(shipped.path, mmap_mode="r").dtype == np.float16
    spec.prepare()
    # re-encoded passages match their shipped rows far closer than the build's own check requires
    check = shipped.verify(BUNDLED_CORPUS, plan_blocks(BUNDLED_CORPUS, 2000), spec, size=24, min_cosine=0.9999)
    assert check is not None and check["sample_rows"] == 24 and check["cosine_min"] >= 0.9999


def test_a_build_takes_the_shipped_vectors_and_records_it(encoded, tmp_path, monkeypatch):
    corpus, index_dir, exported = encoded
    monkeypatch.setattr(shipped_module, "SHIPPED_DIR", exported.parent)
    built = ensure_index(config_for(corpus, tmp_path / "index"), use_ray=False)
    manifest = load_index_dir(built).manifest
    vectors = manifest["build"]["vectors"]
    assert vectors["source"] == "shipped" and vectors["file"] == exported.name and vectors["verified"]
    assert manifest["build"]["passages_encoded"] == 0 and manifest["count"] == N
    fresh = load_index_dir(built).vectors(range(N))
    reference = load_index_dir(index_dir).vectors(range(N))
    assert np.array_equal(fresh, reference.astype(np.float16).astype(np.float32))  # the encoding, rounded to float16
    assert load_index_dir(built).docs.table.equals(load_index_dir(index_dir).docs.table)


def test_shipped_vectors_that_do_not_match_their_passages_are_not_used(encoded, tmp_path, monkeypatch, caplog):
    corpus, _, exported = encoded
    wrong = tmp_path / "vectors"
    shutil.copytree(exported.parent, wrong)
    rows = np.load(wrong / exported.name)
    np.save(wrong / exported.name, rows[::-1])  # rows no longer the corpus's lines in order
    monkeypatch.setattr(shipped_module, "SHIPPED_DIR", wrong)
    with caplog.at_level(logging.WARNING):
        built = ensure_index(config_for(corpus, tmp_path / "index"), use_ray=False)
    manifest = load_index_dir(built).manifest
    assert manifest["build"]["vectors"] == {"source": "encoded"} and manifest["build"]["passages_encoded"] == N
    assert "not using the shipped vectors" in caplog.text and "do not match their stored vectors" in caplog.text


def test_shipped_vectors_of_other_settings_or_another_corpus_are_not_found(encoded, tmp_path):
    corpus, _, exported = encoded
    spec = encoder_spec(config_for(corpus, tmp_path).retrieval)
    sha = file_sha256(corpus)
    assert shipped_module.find_shipped(spec, sha, exported.parent) is not None
    assert shipped_module.find_shipped(spec, "0" * 64, exported.parent) is None
    longer = encoder_spec(config_for(corpus, tmp_path, "retrieval.max_length=128").retrieval)
    assert shipped_module.find_shipped(longer, sha, exported.parent) is None
    meta_file = exported.with_suffix(".json")
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "rows": N + 1}))
    try:
        with pytest.raises(IndexMismatchError, match=f"holds {N} x 384 vectors"):
            shipped_module.find_shipped(spec, sha, exported.parent)
    finally:
        meta_file.write_text(json.dumps(meta))


def test_only_a_flat_index_exports_its_vectors(encoded, tmp_path):
    corpus, _, _ = encoded
    config = config_for(corpus, tmp_path / "ivf", "retrieval.shipped_vectors=false", "retrieval.index_type=ivf",
                        "retrieval.ivf_nlist=2")
    built = ensure_index(config, use_ray=False)
    with pytest.raises(IndexMismatchError, match="only a flat index"):
        shipped_module.export_vectors(built, encoder_spec(config.retrieval), tmp_path / "out", "test")
