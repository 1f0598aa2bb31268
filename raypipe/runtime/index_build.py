"""Building or reusing the retrieval index directory, as every job that needs an index does (``raypipe index``, the
probe job's and the services' ``retrieval.backend: actors``, through :func:`raypipe.runtime.retrieval.open_retrieval`).

:func:`ensure_index` hashes the corpus; if the target directory's manifest matches the configured build
it stops (no-op), else it builds the directory under a lock (:func:`raypipe.retrieval.build.build_index`,
which resumes an interrupted build). Passages are read and encoded block by block by a Ray Data
pipeline (:func:`ray_encode_blocks`: read tasks over the corpus's byte ranges, then an actor pool of
:class:`BlockEncoder`), or in-process for small tests (``use_ray=False``); the final assembly of FAISS,
doc store and statistics runs as a Ray task, so the driver's memory stays flat whatever the corpus size; the
task writes a flat index's file block by block (:func:`raypipe.retrieval.build.stream_flat_index`), so it holds
one block of vectors, not the whole array (wiki-18's 64.6 GB would not fit a 32 GiB head).
A block takes minutes on a CPU, so the actors count the passages of each encoder call in a
:class:`~raypipe.runtime.tally.Tally` and the driver logs that count every 15 s (``encode actors: ...``).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raypipe.core.config import RetrievalConfig, RunConfig
from raypipe.core.progress import Progress
from raypipe.retrieval.build import (
    Block,
    EncodeBlocks,
    EncodedBlock,
    assemble_index,
    build_index,
    corpus_path,
    encode_docs,
    encoder_spec,
    index_dir_for,
    index_settings,
    plan_blocks,
    read_block,
    up_to_date,
)
from raypipe.retrieval.encoders import Encoder, EncoderSpec
from raypipe.retrieval.index import expected_manifest, file_sha256
from raypipe.retrieval.shipped import find_shipped
from raypipe.runtime.batch_stage import BatchStage, BatchUDF
from raypipe.runtime.tally import TalliedEncoder, report_tally, start_tally

log = logging.getLogger(__name__)


def ensure_index(config: RunConfig, force: bool = False, use_ray: bool = True) -> Path:
    """Return a complete index directory for ``config``, building it unless an identical build exists.

    An existing index built with other settings is an :class:`IndexMismatchError` (naming the
    differences) unless ``force``; a non-empty directory that is not an index is never overwritten.
    ``use_ray``: encode on a Ray Data pipeline and assemble in a Ray task (needs a running Ray), else
    everything in this process.
    """
    cfg = config.retrieval
    corpus = corpus_path(config.data)
    if not corpus.exists():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    sha = file_sha256(corpus)
    spec = encoder_spec(cfg)
    expected = expected_manifest(
        spec, index_settings(cfg), corpus, sha, None if cfg.encode.shipped_vectors else "encoded"
    )
    target = index_dir_for(config, sha, spec)
    if up_to_date(target, expected, force):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be building the same index
        if up_to_date(target, expected, force):
            return target
        encode, vectors = shipped_encoding(config, spec, corpus, sha)
        if encode is None and use_ray:
            encode = partial(ray_encode_blocks, cfg=cfg)
        build_index(
            config,
            target,
            expected,
            encode=encode,
            assemble=ray_assemble if use_ray else None,
            vectors=vectors,
            spec=spec,
        )
    return target


def shipped_encoding(
    config: RunConfig, spec: EncoderSpec, corpus: Path, sha: str
) -> tuple[EncodeBlocks | None, dict | None]:
    """The shipped vectors' ``EncodeBlocks`` and their manifest entry when ``retrieval.encode.shipped_vectors`` is
    on, the package ships vectors of this corpus for this encoder and a re-encoded sample matches them; else
    (None, None).
    Reading them takes seconds, so it runs in this process whatever ``use_ray``."""
    if not config.retrieval.encode.shipped_vectors:
        return None, None
    shipped = find_shipped(spec, sha)
    if shipped is None:
        return None, None
    spec.prepare()
    check = shipped.verify(corpus, plan_blocks(corpus, config.retrieval.encode.block_rows), spec)
    if check is None:
        return None, None
    log.info(
        "using the shipped vectors %s: every row a unit vector, %d re-encoded passages and the rankings of %d "
        "questions match (cosine min %.5f; sample seed %d)",
        shipped.path,
        check["sample_rows"],
        check["rank_questions"],
        check["cosine_min"],
        check["seed"],
    )
    return shipped.encode_blocks, {
        "source": "shipped",
        "file": shipped.path.name,
        "made_by": shipped.meta.get("made_by"),
        **check,
    }


def read_blocks(batch: pa.Table, corpus: str) -> pa.Table:
    """Ray Data UDF (tasks): block descriptors -> one row per block with its rows and frequencies (Arrow IPC)."""
    out = {"block": [], "docs": [], "df": []}
    for desc in batch.column("block").to_pylist():
        docs, df = read_block(Path(corpus), Block(**desc))
        out["block"].append(desc)
        out["docs"].append(_ipc_bytes(docs))
        out["df"].append(_ipc_bytes(df))
    return pa.table(out)


class BlockEncoder(BatchUDF):
    """Ray Data UDF (actor pool): blocks' rows (column ``docs``) -> their embeddings, longest passage first
    inside each block (one encoder per actor)."""

    stage_name = "encode stage"
    input_columns = ("docs",)

    def __init__(self, spec: EncoderSpec, call_rows: int, actors_per_node: int = 1, tally: Any = None):
        if spec.threads is None:
            spec = EncoderSpec(**{**spec.__dict__, "threads": max(1, (os.cpu_count() or 1) // actors_per_node)})
        self.encoder: Encoder = spec.load() if tally is None else TalliedEncoder(spec.load(), tally)
        self.call_rows = call_rows

    def process(self, batch: pa.Table) -> pa.Table:
        embeddings, dims, cpu = [], [], []
        for docs in batch.column("docs").to_pylist():
            vectors, cpu_s = encode_docs(self.encoder, _from_ipc(docs), self.call_rows)
            embeddings.append(vectors.tobytes())
            dims.append(vectors.shape[1])
            cpu.append(cpu_s)
        return (
            batch.append_column("embedding", pa.array(embeddings, pa.large_binary()))
            .append_column("dim", pa.array(dims, pa.int64()))
            .append_column("cpu_s", pa.array(cpu, pa.float64()))
        )


def ray_encode_blocks(
    spec: EncoderSpec, corpus: Path, blocks: list[Block], cfg: RetrievalConfig
) -> Iterator[EncodedBlock]:
    """Read (Ray tasks over byte ranges of the corpus) and encode (actor pool of ``retrieval.encode.actors``) the
    blocks; yields each block when it is done, in any order. The driver holds one block at a time and
    logs the passages the actors have encoded every 15 s."""
    import ray

    if not blocks:
        return
    if cfg.encode.threads:
        spec = EncoderSpec(**{**spec.__dict__, "threads": cfg.encode.threads})
    ds = ray.data.from_items([{"block": asdict(b)} for b in blocks], override_num_blocks=len(blocks))
    ds = ds.map_batches(
        read_blocks,
        fn_kwargs={"corpus": str(corpus)},
        batch_size=1,
        batch_format="pyarrow",
        num_cpus=cfg.encode.read_num_cpus,
    )
    tally = start_tally()
    ds = BatchStage(
        BlockEncoder,
        {"spec": spec, "call_rows": cfg.encode.batch_size, "actors_per_node": cfg.encode.actors, "tally": tally},
        actors=min(cfg.encode.actors, len(blocks)),
        batch_size=1,
        num_cpus=cfg.encode.num_cpus,
        num_gpus=cfg.encode.num_gpus,
        # one block per actor at a time: a block queued behind a busy actor would wait there while
        # another actor idles (Ray Data's default of 4 in flight ran the bundled corpus on one actor)
        pool={"max_tasks_in_flight_per_actor": 1},
    ).apply(ds)
    progress = Progress("passages encoded", sum(b.n_rows for b in blocks), label="encode actors", every_s=0, log=log)
    try:
        with report_tally(tally, progress):
            for row in ds.iter_rows():
                block = Block(**row["block"])
                embeddings = np.frombuffer(row["embedding"], dtype=np.float32).reshape(block.n_rows, row["dim"])
                yield EncodedBlock(block, _from_ipc(row["docs"]), _from_ipc(row["df"]), embeddings, row["cpu_s"])
    finally:
        ray.kill(tally)


def ray_assemble(*args) -> Path:
    """:func:`assemble_index` as a Ray task: the FAISS index is built in a worker, not in the driver,
    on the driver's node (where the driver wrote the build directory)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return ray.get(ray.remote(num_cpus=0, scheduling_strategy=here)(assemble_index).remote(*args))


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
