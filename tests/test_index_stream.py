"""The flat index written block by block (issue 40, finding 3): no process holds all vectors, and the file is
the one faiss writes for the filled index, so searches return what they returned before."""

import numpy as np
import pytest

from raypipe.data.loaders import iter_corpus
from raypipe.retrieval import IndexSettings, encoder_spec, load_index_dir, passage_text
from raypipe.retrieval import build as build_module
from raypipe.retrieval.index import build_faiss
from raypipe.runtime.index_build import ensure_index
from tests.test_index_build import config_for, corpus  # noqa: F401  (the module's corpus fixture)


def unit_rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("fp16", [False, True])
def test_streamed_flat_file_equals_faiss_write_index(tmp_path, fp16):
    import faiss

    rows, settings = unit_rows(103, 24), IndexSettings("flat", fp16=fp16)
    streamed = tmp_path / "streamed.faiss"
    factory = build_module.stream_flat_index(
        lambda: (rows[i : i + 10] for i in range(0, 103, 10)), 103, 24, settings, streamed
    )
    index, expected_factory = build_faiss(rows, settings)
    faiss.write_index(index, str(tmp_path / "whole.faiss"))
    assert factory == expected_factory
    assert streamed.read_bytes() == (tmp_path / "whole.faiss").read_bytes()
    queries = unit_rows(5, 24, seed=1)
    got, expected = faiss.read_index(str(streamed)).search(queries, 7), index.search(queries, 7)
    assert np.array_equal(got[1], expected[1]) and np.array_equal(got[0], expected[0])


def test_an_index_that_trains_is_not_streamed(tmp_path):
    rows = unit_rows(2000, 16)
    assert build_module.stream_flat_index(lambda: [rows], 2000, 16, IndexSettings("ivf"), tmp_path / "x") is None
    assert not (tmp_path / "x").exists()


def test_flat_build_never_holds_the_whole_index(corpus, tmp_path, monkeypatch):  # noqa: F811
    """The assembly adds no flat index in memory; the built index holds every passage's vector in corpus order
    and finds each passage by its own text."""

    def in_memory(*args, **kwargs):
        raise AssertionError("the flat index was built in memory")

    monkeypatch.setattr(build_module, "build_faiss_chunked", in_memory)
    config = config_for(corpus, tmp_path / "idx")
    idx = load_index_dir(ensure_index(config, use_ray=False))
    passages = list(iter_corpus(corpus))
    expected = encoder_spec(config.retrieval).load().encode_passages([passage_text(p.title, p.text) for p in passages])
    assert np.array_equal(idx.vectors(range(len(passages))), expected)
    _, rows = idx.faiss_index().search(expected[:5], 1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]
