"""The index job: build or reuse the index directory, the Ray Data encode, and the entry point
(``raypipe index``, ``python jobs/index.py``).

:func:`ensure_index` hashes the corpus; if the target directory's manifest matches the configured build
it stops (no-op), else it builds the directory under a lock (:func:`raypipe.retrieval.build.build_index`),
encoding the passages with a Ray Data ``map_batches`` over an actor pool of :class:`PassageEncoder`
(:func:`ray_encode`), or in-process for small tests (``use_ray=False``).
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.core.config import RetrievalConfig, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.progress import Progress
from raypipe.retrieval.build import (
    ENCODE_LINE_EVERY_S,
    batch_texts,
    build_index,
    corpus_path,
    encoder_spec,
    index_dir_for,
    index_settings,
    length_order,
    up_to_date,
)
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.index import RetrievalIndexError, expected_manifest, file_sha256, load_index_dir
from raypipe.runtime.cluster import init_ray

DESCRIPTION = """Build the retrieval index (encoder + FAISS + doc store + corpus statistics) for the configured corpus.

Encodes the corpus (data.corpus) with retrieval.encoder as a Ray Data map_batches over an actor pool
(retrieval.encode_actors, encode_num_cpus / encode_num_gpus), builds the FAISS index
(retrieval.index_type, fp16) and writes the index directory (retrieval.index_dir, or one in
$RAYPIPE_CACHE/indexes keyed by corpus hash, encoder and index type). Rebuilding an unchanged corpus
with the same settings does nothing; --force rebuilds. Prints the index directory and a summary.
"""


log = logging.getLogger(__name__)


def ensure_index(config: RunConfig, force: bool = False, use_ray: bool = True) -> Path:
    """Return a complete index directory for ``config``, building it unless an identical build exists.

    An existing index built with other settings is an :class:`IndexMismatchError` (naming the
    differences) unless ``force``; a non-empty directory that is not an index is never overwritten.
    ``use_ray``: encode on a Ray Data actor pool (needs a running Ray), else in this process.
    """
    cfg = config.retrieval
    corpus = corpus_path(config.data)
    if not corpus.exists():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    sha = file_sha256(corpus)
    expected = expected_manifest(encoder_spec(cfg), index_settings(cfg), corpus, sha)
    target = index_dir_for(config, sha)
    if up_to_date(target, expected, force):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be building the same index
        if up_to_date(target, expected, force):
            return target
        build_index(config, target, expected, encode=partial(ray_encode, cfg=cfg) if use_ray else None)
    return target


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
    :func:`~raypipe.retrieval.build.length_order`); the embeddings in doc-store order and the actors'
    CPU-seconds."""
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
        progress = Progress("passages", n, label="encode", every_s=ENCODE_LINE_EVERY_S, log=log)
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
            progress.advance(len(got))
    finally:
        ctx.execution_options.preserve_order = keep_order
    if pos != n or out is None:
        raise RuntimeError(f"encoded {pos} of {n} passages")
    log.info("encoder actors used %.0f CPU-seconds (%.1f passages per CPU-second)", cpu_s, n / max(cpu_s, 1e-9))
    result = np.empty_like(out)
    result[order] = out
    return result, cpu_s


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("--force", action="store_true", help="rebuild even if an identical index exists")
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)

    import ray

    start = time.perf_counter()
    init_ray(config)
    try:
        path = ensure_index(config, force=args.force)
    except (RetrievalIndexError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    manifest = load_index_dir(path).manifest
    size = sum(p.stat().st_size for p in path.iterdir())
    print(f"\nindex: {path}")
    for key in ("encoder", "dimension", "count", "index_type", "fp16", "factory", "corpus", "created"):
        print(f"  {key:<10} {manifest[key]}")
    print(f"  {'size':<10} {size / 1e6:.1f} MB on disk")
    print(f"  {'elapsed':<10} {time.perf_counter() - start:.1f} s")
