"""Fixtures shared by the test modules; the helpers they build on are in tests/helpers/."""

import os
from pathlib import Path

import pytest

# Tests run offline; converted models, indexes and compile caches go where every entry point puts them
# (raypipe.core.models.cache_dir: $RAYPIPE_CACHE if set, else ~/.cache/raypipe).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def write_jsonl(tmp_path):
    """Write raw lines (str or bytes) to a file and return its path."""

    def _write(lines, name="data.jsonl"):
        path = tmp_path / name
        with path.open("wb") as fh:
            for line in lines:
                fh.write(line if isinstance(line, bytes) else line.encode("utf-8"))
                fh.write(b"\n")
        return path

    return _write


@pytest.fixture(scope="session")
def paragraph_corpus(tmp_path_factory):
    """``make(datasets, limit)``: a corpus of just the paragraphs of those questions (indexes in seconds)."""
    from tests.helpers.corpora import paragraph_corpus as write_corpus

    def make(datasets: tuple[str, ...], limit: int) -> Path:
        return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", datasets, limit)

    return make


@pytest.fixture(scope="module")
def ray_local():
    """A local 2-CPU Ray for the module's tests (``tests.helpers.local_ray``), shut down after them."""
    ray = pytest.importorskip("ray")
    from tests.helpers.local_ray import init_local_ray

    init_local_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A tiny BERT encoder with MiniLM's tokenizer (``tests.helpers.tiny_models.tiny_encoder``)."""
    pytest.importorskip("torch")
    from tests.helpers.tiny_models import tiny_encoder as save_tiny_encoder

    return save_tiny_encoder(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def sim_cluster():
    """The simulated GPU cluster of ``tests.helpers.cluster.simulated_gpu_cluster`` (a 0-CPU head, a
    gpu_worker with 2 fake GPUs, a retrieval_worker; per-node local folders, one shared folder), for the
    module's tests; stopped after them."""
    from tests.helpers.cluster import cache_env, simulated_gpu_cluster

    with simulated_gpu_cluster(cache_env()) as cluster:
        yield cluster
