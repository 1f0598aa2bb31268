"""benchmarks/retrieval.py after `make run` (issue 41 item 11): its index configuration is the one the job
builds, shipped vectors included, so it reuses that index instead of failing with IndexMismatchError;
--force asks for an encoding."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from raypipe.core.config import load_config
from raypipe.data.loaders import BUNDLED_CORPUS
from raypipe.retrieval import encoder_spec, load_index_dir
from raypipe.retrieval import shipped as shipped_module
from raypipe.retrieval.build import index_dir_for
from raypipe.retrieval.index import IndexMismatchError
from raypipe.runtime.index_build import ensure_index

ROOT = Path(__file__).resolve().parents[1]
N = 40  # passages of the small corpus


@pytest.fixture(scope="module")
def bench():
    """benchmarks/retrieval.py, imported by path (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("benchmark_retrieval", ROOT / "benchmarks" / "retrieval.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def job_config(corpus, index_dir, *extra):
    """The embedded preset `make run` uses, over a small corpus and index folder."""
    return load_config(
        "embedded",
        [f"data.corpus={corpus}", f"retrieval.index.dir={index_dir}", "retrieval.encode.block_rows=16", *extra],
    )


@pytest.mark.slow  # builds two small indexes (about 25 s on 2 busy cores)
def test_the_benchmark_reuses_the_index_make_run_builds_from_shipped_vectors(bench, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(N)))
    encoded = ensure_index(
        job_config(corpus, tmp_path / "encoded", "retrieval.encode.shipped_vectors=false"), use_ray=False
    )
    job = job_config(corpus, tmp_path / "index")
    exported = shipped_module.export_vectors(encoded, encoder_spec(job.retrieval), tmp_path / "vectors", "test")
    monkeypatch.setattr(shipped_module, "SHIPPED_DIR", exported.parent)  # this corpus's vectors ship
    built = ensure_index(job, use_ray=False)  # what `make run` does on a first run
    assert load_index_dir(built).manifest["vectors"] == "shipped-float16"

    column = bench.bench_config(job, job.retrieval.encoder, force=False)
    assert index_dir_for(column) == built
    assert ensure_index(column, use_ray=False) == built  # reused as it is: no IndexMismatchError, no rebuild
    assert load_index_dir(built).manifest["vectors"] == "shipped-float16"
    forced = bench.bench_config(job, job.retrieval.encoder, force=True)  # --force: the build timed is an encoding's
    assert forced.retrieval.encode.shipped_vectors is False and index_dir_for(forced) == built
    with pytest.raises(IndexMismatchError, match="vectors: index has 'shipped-float16', configured 'encoded'"):
        ensure_index(forced, use_ray=False)  # what the benchmark asked for before, without --force


def test_each_column_uses_the_index_folder_a_job_with_its_encoder_uses(bench):
    job = load_config("embedded", [])
    default = index_dir_for(job)
    assert index_dir_for(bench.bench_config(job, "minilm", force=False)) == default
    assert index_dir_for(bench.bench_config(job, "minilm@none", force=False)) == default
    int8 = bench.bench_config(job, "minilm@int8", force=False)  # its own folder: no clash with the job's fp32 index
    assert (
        index_dir_for(int8)
        == index_dir_for(load_config("embedded", ["retrieval.encoder_quantization=int8"]))
        != default
    )
    assert bench.bench_config(job, "minilm", force=False).retrieval.encode.shipped_vectors is True
