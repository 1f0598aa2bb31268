"""Build (or reuse) the index directory for a run configuration.

Steps: hash the corpus file; if the target directory's manifest matches the configured build, stop
(no-op). Otherwise stream the corpus once into the doc store and the document-frequency statistics,
encode the passages (a Ray Data ``map_batches`` over an actor pool of encoders, or in-process for small
tests), build the FAISS index and write the directory atomically.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.core.config import DataConfig, RetrievalConfig, RunConfig
from raypipe.core.models import cache_dir
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus
from raypipe.retrieval.encoders import EncoderSpec, passage_text
from raypipe.retrieval.index import (
    MANIFEST,
    IndexMismatchError,
    IndexSettings,
    SearchParams,
    default_index_dir,
    expected_manifest,
    file_sha256,
    manifest_differences,
    read_manifest,
    write_index_dir,
)
from raypipe.retrieval.store import CorpusStats, DocStore

log = logging.getLogger(__name__)


def encoder_spec(cfg: RetrievalConfig, threads: int | None = None) -> EncoderSpec:
    return EncoderSpec(
        ref=cfg.encoder,
        prefixes=cfg.encoder_prefixes,
        max_length=cfg.max_length,
        batch_size=min(cfg.encode_batch_size, 128),
        threads=threads,
        backend=cfg.encoder_backend,
        quantization=cfg.encoder_quantization,
    )


def index_settings(cfg: RetrievalConfig) -> IndexSettings:
    return IndexSettings(
        index_type=cfg.index_type,
        fp16=cfg.fp16,
        ivf_nlist=cfg.ivf_nlist,
        pq_m=cfg.pq_m,
        pq_nbits=cfg.pq_nbits,
        hnsw_m=cfg.hnsw_m,
    )


def search_params(cfg: RetrievalConfig) -> SearchParams:
    return SearchParams(nprobe=cfg.nprobe, hnsw_ef_search=cfg.hnsw_ef_search, faiss_gpu=cfg.faiss_gpu)


def corpus_path(data: DataConfig) -> Path:
    return BUNDLED_CORPUS if data.corpus == "bundled" else Path(data.corpus).expanduser()


def index_dir_for(config: RunConfig, corpus_sha256: str | None = None) -> Path:
    """The configured index directory, or the default one in the cache keyed by corpus and settings."""
    if config.retrieval.index_dir:
        return Path(config.retrieval.index_dir).expanduser()
    sha = corpus_sha256 or file_sha256(corpus_path(config.data))
    return default_index_dir(cache_dir(), sha, encoder_spec(config.retrieval).name, index_settings(config.retrieval))


def ensure_index(config: RunConfig, force: bool = False, use_ray: bool = True) -> Path:
    """Return a complete index directory for ``config``, building it unless an identical build exists.

    An existing index built with other settings is an :class:`IndexMismatchError` (naming the
    differences) unless ``force``; a non-empty directory that is not an index is never overwritten.
    """
    cfg = config.retrieval
    corpus = corpus_path(config.data)
    if not corpus.exists():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    sha = file_sha256(corpus)
    spec = encoder_spec(cfg)
    settings = index_settings(cfg)
    expected = expected_manifest(spec, settings, corpus, sha)
    target = index_dir_for(config, sha)
    if _up_to_date(target, expected, force):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be building the same index
        if _up_to_date(target, expected, force):
            return target
        build_index(config, target, expected, use_ray=use_ray)
    return target


def _up_to_date(target: Path, expected: dict, force: bool) -> bool:
    """True if ``target`` holds this exact build; raises if it holds something else (unless ``force``)."""
    if not target.exists():
        return False
    if (target / MANIFEST).exists():
        if force:
            return False
        problems = manifest_differences(read_manifest(target), expected)
        if problems:
            raise IndexMismatchError(f"index {target} was built differently: {'; '.join(problems)} (rebuild with --force)")
        log.info("index %s is up to date (corpus %s), nothing to do", target, expected["corpus_sha256"][:12])
        return True
    if any(target.iterdir()):
        raise IndexMismatchError(f"{target} exists and is not an index directory; refusing to overwrite it")
    return False


def build_index(config: RunConfig, target: Path, manifest: dict, use_ray: bool = True) -> Path:
    cfg = config.retrieval
    corpus = Path(manifest["corpus"])
    work = target.with_name(f".{target.name}.build")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        start = time.perf_counter()
        passages = list(iter_corpus(corpus))
        if not passages:
            raise ValueError(f"corpus {corpus} has no passages")
        docs_file = work / "docs.parquet"
        DocStore.write(passages, docs_file)
        stats = CorpusStats.count(passages)
        del passages
        prepare_s = time.perf_counter() - start
        log.info("corpus %s: %d passages, %d terms (%.1f s)", corpus.name, stats.n_docs, len(stats.df_table), prepare_s)
        table = DocStore.read(docs_file).table
        start = time.perf_counter()
        spec = encoder_spec(cfg)
        spec.prepare()  # export / quantise the ONNX model once here, not in every actor
        cpu_start = time.process_time()
        if use_ray:
            embeddings, encode_cpu_s = ray_encode(spec, table, cfg)
        else:
            embeddings = local_encode(spec, table)
            encode_cpu_s = time.process_time() - cpu_start
        encode_s = time.perf_counter() - start
        log.info("encoded %d passages with %s in %.1f s (%.0f passages/s)", len(embeddings), spec.name, encode_s,
                 len(embeddings) / max(encode_s, 1e-9))
        start = time.perf_counter()
        # encode_cpu_seconds: the encoders' CPU time (Ray: the actors'), steadier than wall on a shared machine
        timing = {"prepare_seconds": round(prepare_s, 2), "encode_seconds": round(encode_s, 2),
                  "encode_cpu_seconds": round(encode_cpu_s, 2)}
        write_index_dir(target, embeddings, docs_file, stats, {**manifest, "build": timing}, index_settings(cfg))
        log.info("wrote %s index to %s (%.1f s)", cfg.index_type, target, time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def batch_texts(batch: dict) -> list[str]:
    return [passage_text(t, x) for t, x in zip(batch["title"], batch["text"])]


def length_order(table: pa.Table) -> np.ndarray:
    """Row order longest passage first (characters of title + text, a cheap proxy for tokens).

    Encoding in this order puts passages of similar length into the same call, and each encoder call
    sorts its passages by tokens, so a batch is padded little (bundled corpus: 1.09x the real tokens,
    against 1.41x in corpus order with sentence-transformers' per-call sort by characters)."""
    import pyarrow.compute as pc

    lengths = pc.add(pc.utf8_length(table.column("title")), pc.utf8_length(table.column("text")))
    return np.argsort(-lengths.to_numpy(zero_copy_only=False), kind="stable")


def local_encode(spec: EncoderSpec, table: pa.Table, chunk: int = 1024) -> np.ndarray:
    """Encode the doc store in this process (tests, small corpora); rows in doc-store order."""
    encoder = spec.load()
    order = length_order(table)
    ordered = table.take(order)
    out: np.ndarray | None = None
    for offset in range(0, table.num_rows, chunk):
        part = encoder.encode_passages(batch_texts(ordered.slice(offset, chunk).to_pydict()))
        if out is None:
            out = np.empty((table.num_rows, part.shape[1]), dtype=np.float32)
        out[order[offset : offset + len(part)]] = part
        log.info("encoded %d / %d passages", offset + len(part), table.num_rows)
    assert out is not None
    return out


class PassageEncoder:
    """Ray Data UDF: a batch of doc-store rows -> their embeddings (one encoder per actor)."""

    def __init__(self, spec: EncoderSpec, actors_per_node: int = 1):
        if spec.threads is None:
            spec = EncoderSpec(**{**spec.__dict__, "threads": max(1, (os.cpu_count() or 1) // actors_per_node)})
        self.encoder = spec.load()

    def __call__(self, batch: dict) -> dict:
        cpu = time.process_time()
        embedding = self.encoder.encode_passages(batch_texts(batch))
        share = (time.process_time() - cpu) / max(len(embedding), 1)  # this actor's CPU time, spread over the rows
        return {"doc_id": batch["doc_id"], "embedding": embedding, "cpu_s": np.full(len(embedding), share)}


def ray_encode(spec: EncoderSpec, table: pa.Table, cfg: RetrievalConfig) -> tuple[np.ndarray, float]:
    """Encode with Ray Data on an actor pool of ``encode_actors``, longest passages first (see
    :func:`length_order`); the embeddings in doc-store order and the actors' CPU-seconds."""
    import ray

    if cfg.encode_threads:
        spec = EncoderSpec(**{**spec.__dict__, "threads": cfg.encode_threads})
    order = length_order(table)
    table = table.take(order)
    n = table.num_rows
    n_blocks = max(cfg.encode_actors * 4, math.ceil(n / (cfg.encode_batch_size * 8)))
    size = math.ceil(n / n_blocks)
    ctx = ray.data.DataContext.get_current()
    keep_order = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True  # rows must come back in doc-store (FAISS id) order
    try:
        ds = ray.data.from_arrow([table.slice(i, size) for i in range(0, n, size)])
        ds = ds.map_batches(
            PassageEncoder,
            fn_constructor_kwargs={"spec": spec, "actors_per_node": cfg.encode_actors},
            batch_size=cfg.encode_batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cfg.encode_actors),
            num_cpus=cfg.encode_num_cpus,
            num_gpus=cfg.encode_num_gpus,
        )
        doc_ids = table.column("doc_id").to_pylist()
        out: np.ndarray | None = None
        pos, cpu_s = 0, 0.0
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            cpu_s += float(np.sum(batch["cpu_s"]))
            emb = np.asarray(batch["embedding"], dtype=np.float32)
            if out is None:
                out = np.empty((n, emb.shape[1]), dtype=np.float32)
            got = list(batch["doc_id"])
            if got != doc_ids[pos : pos + len(got)]:
                raise RuntimeError(f"encoded rows came back out of order at row {pos}")
            out[pos : pos + len(got)] = emb
            pos += len(got)
    finally:
        ctx.execution_options.preserve_order = keep_order
    if pos != n or out is None:
        raise RuntimeError(f"encoded {pos} of {n} passages")
    log.info("encoder actors used %.0f CPU-seconds (%.1f passages per CPU-second)", cpu_s, n / max(cpu_s, 1e-9))
    result = np.empty_like(out)
    result[order] = out
    return result, cpu_s
