"""The index job: build or reuse the index directory, the Ray Data block pipeline, the import of an
existing FAISS index, and the entry point (``raypipe index``, ``python jobs/index.py``).

:func:`ensure_index` hashes the corpus; if the target directory's manifest matches the configured build
it stops (no-op), else it builds the directory under a lock (:func:`raypipe.retrieval.build.build_index`,
which resumes an interrupted build). Passages are read and encoded block by block by a Ray Data
pipeline (:func:`ray_encode_blocks`: read tasks over the corpus's byte ranges, then an actor pool of
:class:`BlockEncoder`), or in-process for small tests (``use_ray=False``); the final assembly of FAISS,
doc store and statistics runs as a Ray task, so the driver's memory stays flat whatever the corpus size.
A block takes minutes on a CPU, so the actors count the passages of each encoder call in a
:class:`~raypipe.runtime.tally.Tally` and the driver logs that count every 15 s (``encode actors: ...``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raypipe.core.config import RetrievalConfig, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
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
from raypipe.retrieval.import_faiss import VERIFY_MIN_COSINE, VERIFY_SAMPLE, import_faiss
from raypipe.retrieval.index import RetrievalIndexError, expected_manifest, file_sha256, load_index_dir
from raypipe.retrieval.shipped import export_vectors, find_shipped
from raypipe.runtime.batch_stage import BatchStage, BatchUDF
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.retrieval import check_index_folder
from raypipe.runtime.shared_storage import SharedStorageError
from raypipe.runtime.tally import TalliedEncoder, report_tally, start_tally

DESCRIPTION = """Build the retrieval index (encoder + FAISS + doc store + corpus statistics) for the configured corpus.

Reads the corpus (data.corpus) in blocks of retrieval.build_block_rows passages, encodes them with
retrieval.encoder on a Ray Data actor pool (retrieval.encode_actors, encode_num_cpus / encode_num_gpus),
writes each block as it is done (a rerun after an interruption encodes only the missing blocks), then
builds the FAISS index (retrieval.index_type, fp16) and writes the index directory (retrieval.index_dir,
or one in $RAYPIPE_CACHE/indexes keyed by corpus hash, encoder and index type). Rebuilding an unchanged
corpus with the same settings does nothing; --force rebuilds. Prints the index directory and a summary.

--import-faiss INDEX_FILE --corpus CORPUS.jsonl --encoder ENCODER --out INDEX_DIR turns an existing
FAISS index whose row i is line i of the corpus (e.g. Search-R1's e5_Flat.index over wiki-18.jsonl)
into an index directory without re-encoding, after checking a re-encoded sample (unless --no-verify).

The bundled corpus's vectors ship with the package (retrieval.shipped_vectors): its build checks a
re-encoded sample against them and encodes nothing. --export-vectors DIR writes an index's vectors in
that format; `raypipe index --set retrieval.shipped_vectors=false --force --export-vectors DIR`
reproduces the shipped file from an encoding.
"""


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
    expected = expected_manifest(spec, index_settings(cfg), corpus, sha, None if cfg.shipped_vectors else "encoded")
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
        build_index(config, target, expected, encode=encode, assemble=ray_assemble if use_ray else None, vectors=vectors,
                    spec=spec)
    return target


def shipped_encoding(
    config: RunConfig, spec: EncoderSpec, corpus: Path, sha: str
) -> tuple[EncodeBlocks | None, dict | None]:
    """The shipped vectors' ``EncodeBlocks`` and their manifest entry when ``retrieval.shipped_vectors`` is on, the
    package ships vectors of this corpus for this encoder and a re-encoded sample matches them; else (None, None).
    Reading them takes seconds, so it runs in this process whatever ``use_ray``."""
    if not config.retrieval.shipped_vectors:
        return None, None
    shipped = find_shipped(spec, sha)
    if shipped is None:
        return None, None
    spec.prepare()
    check = shipped.verify(corpus, plan_blocks(corpus, config.retrieval.build_block_rows), spec)
    if check is None:
        return None, None
    log.info("using the shipped vectors %s: %d re-encoded passages match (cosine min %.5f)",
             shipped.path, check["sample_rows"], check["cosine_min"])
    return shipped.encode_blocks, {"source": "shipped", "file": shipped.path.name, "made_by": shipped.meta.get("made_by"), **check}


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
        return batch.append_column("embedding", pa.array(embeddings, pa.large_binary())).append_column(
            "dim", pa.array(dims, pa.int64())).append_column("cpu_s", pa.array(cpu, pa.float64()))


def ray_encode_blocks(spec: EncoderSpec, corpus: Path, blocks: list[Block], cfg: RetrievalConfig) -> Iterator[EncodedBlock]:
    """Read (Ray tasks over byte ranges of the corpus) and encode (actor pool of ``encode_actors``) the
    blocks; yields each block when it is done, in any order. The driver holds one block at a time and
    logs the passages the actors have encoded every 15 s."""
    import ray

    if not blocks:
        return
    if cfg.encode_threads:
        spec = EncoderSpec(**{**spec.__dict__, "threads": cfg.encode_threads})
    ds = ray.data.from_items([{"block": asdict(b)} for b in blocks], override_num_blocks=len(blocks))
    ds = ds.map_batches(read_blocks, fn_kwargs={"corpus": str(corpus)}, batch_size=1, batch_format="pyarrow",
                        num_cpus=cfg.read_num_cpus)
    tally = start_tally()
    ds = BatchStage(
        BlockEncoder,
        {"spec": spec, "call_rows": cfg.encode_batch_size, "actors_per_node": cfg.encode_actors, "tally": tally},
        actors=min(cfg.encode_actors, len(blocks)),
        batch_size=1,
        num_cpus=cfg.encode_num_cpus,
        num_gpus=cfg.encode_num_gpus,
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


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("--force", action="store_true", help="rebuild even if an identical index exists")
    parser.add_argument("--export-vectors", metavar="DIR",
                        help="then write the (flat) index's vectors as DIR/<encoder>.npy (float16) and .json: the format of "
                        "the vectors shipped for the bundled corpus (raypipe/data/mhqa/vectors/)")
    imports = parser.add_argument_group("import an existing FAISS index (no re-encoding)")
    imports.add_argument("--import-faiss", metavar="INDEX_FILE", help="a flat inner-product FAISS index; row i = line i of --corpus")
    imports.add_argument("--corpus", metavar="CORPUS.jsonl", help="the corpus of the index (sets data.corpus)")
    imports.add_argument("--encoder", metavar="ENCODER", help="the encoder that made its vectors (sets retrieval.encoder)")
    imports.add_argument("--out", metavar="INDEX_DIR", help="the index directory to write (sets retrieval.index_dir)")
    imports.add_argument("--no-verify", action="store_true", help="skip re-encoding a sample of passages to check the encoder")
    imports.add_argument("--verify-sample", type=int, default=VERIFY_SAMPLE, metavar="N", help=f"passages re-encoded (default {VERIFY_SAMPLE})")
    imports.add_argument("--verify-min-cosine", type=float, default=VERIFY_MIN_COSINE, metavar="C",
                         help=f"least cosine between a stored row and its re-encoded passage (default {VERIFY_MIN_COSINE})")
    args = parser.parse_args()
    setup_logging(args.verbose)
    extra = [f"{key}={value}" for key, value in (("data.corpus", args.corpus), ("retrieval.encoder", args.encoder),
                                                 ("retrieval.index_dir", args.out)) if value]
    config = config_from_args(args, extra)
    spec = encoder_spec(config.retrieval)
    start = time.perf_counter()
    if args.import_faiss:
        if not (args.corpus and args.encoder and args.out):
            parser.error("--import-faiss needs --corpus, --encoder and --out")
        try:
            path = import_faiss(Path(args.import_faiss), Path(args.corpus), spec, Path(args.out),
                                verify=not args.no_verify, block_rows=config.retrieval.build_block_rows,
                                sample=args.verify_sample, min_cosine=args.verify_min_cosine)
        except (RetrievalIndexError, FileNotFoundError, ValueError) as exc:
            raise SystemExit(f"error: {exc}") from None
    else:
        import ray

        init_ray(config)
        try:
            check_index_folder(config)
            path = ensure_index(config, force=args.force)
        except (RetrievalIndexError, FileNotFoundError, ValueError, SharedStorageError) as exc:
            raise SystemExit(f"error: {exc}") from None
        finally:
            ray.shutdown()
    if args.export_vectors:
        command = "raypipe index " + " ".join(sys.argv[1:])
        try:
            exported = export_vectors(path, spec, Path(args.export_vectors), command)
        except RetrievalIndexError as exc:
            raise SystemExit(f"error: {exc}") from None
        print(f"vectors: {exported} and {exported.with_suffix('.json').name}")
    print_summary(path, time.perf_counter() - start)


def print_summary(path: Path, elapsed: float) -> None:
    manifest = load_index_dir(path).manifest
    size = sum(p.stat().st_size for p in path.iterdir())
    print(f"\nindex: {path}")
    for key in ("encoder", "dimension", "count", "index_type", "fp16", "factory", "corpus", "created"):
        print(f"  {key:<10} {manifest[key]}")
    if "import" in manifest:
        imported = manifest["import"]
        check = (f"verified on {imported['sample_rows']} passages (cosine min {imported['cosine_min']})"
                 if imported.get("verified") else "not verified (--no-verify)")
        print(f"  {'imported':<10} {imported['source']} ({imported['source_bytes'] / 1e6:.1f} MB), {check}")
    vectors = manifest.get("build", {}).get("vectors", {})
    if vectors.get("source") == "shipped":
        print(f"  {'vectors':<10} shipped {vectors['file']}, verified on {vectors['sample_rows']} re-encoded passages "
              f"(cosine min {vectors['cosine_min']})")
    print(f"  {'size':<10} {size / 1e6:.1f} MB on disk")
    print(f"  {'elapsed':<10} {elapsed:.1f} s")
