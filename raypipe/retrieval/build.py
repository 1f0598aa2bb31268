"""Write the index directory for a run configuration, without Ray.

:func:`build_index` streams the corpus once into the doc store and the document-frequency statistics,
encodes the passages with the encode function it is given (:func:`local_encode` in this process; the
index job passes its Ray Data actor pool, :mod:`raypipe.stages.index`), builds the FAISS index and
writes the directory atomically. :func:`up_to_date` says whether a directory already holds the build.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.core.config import DataConfig, RetrievalConfig, RunConfig
from raypipe.core.models import cache_dir
from raypipe.core.progress import Progress
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus
from raypipe.retrieval.encoders import EncoderSpec, passage_text
from raypipe.retrieval.index import (
    MANIFEST,
    IndexMismatchError,
    IndexSettings,
    SearchParams,
    default_index_dir,
    file_sha256,
    manifest_differences,
    read_manifest,
    write_index_dir,
)
from raypipe.retrieval.store import CorpusStats, DocStore

log = logging.getLogger(__name__)
ENCODE_LINE_EVERY_S = 10.0  # seconds between the encode loops' progress lines

# (spec, doc-store table) -> (embeddings in doc-store order, the encoders' CPU-seconds)
EncodeFn = Callable[[EncoderSpec, pa.Table], tuple[np.ndarray, float]]


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


def up_to_date(target: Path, expected: dict, force: bool) -> bool:
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


def build_index(config: RunConfig, target: Path, manifest: dict, encode: EncodeFn | None = None) -> Path:
    """Write the index of ``manifest``'s corpus to ``target``; ``encode`` defaults to :func:`local_encode`."""
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
        embeddings, encode_cpu_s = (encode or local_encode)(spec, table)
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


def local_encode(spec: EncoderSpec, table: pa.Table, chunk: int = 1024) -> tuple[np.ndarray, float]:
    """Encode the doc store in this process (tests, small corpora): rows in doc-store order, and the CPU-seconds."""
    cpu = time.process_time()
    encoder = spec.load()
    progress = Progress("passages", table.num_rows, label="encode", every_s=ENCODE_LINE_EVERY_S, log=log)
    order = length_order(table)
    ordered = table.take(order)
    out: np.ndarray | None = None
    for offset in range(0, table.num_rows, chunk):
        part = encoder.encode_passages(batch_texts(ordered.slice(offset, chunk).to_pydict()))
        if out is None:
            out = np.empty((table.num_rows, part.shape[1]), dtype=np.float32)
        out[order[offset : offset + len(part)]] = part
        progress.advance(len(part))
    assert out is not None
    return out, time.process_time() - cpu
