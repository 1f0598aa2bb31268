"""The index directory: layout, manifest, FAISS index construction, loading and its checks.

Layout of an index directory (written to a temporary sibling and renamed into place when complete)::

    manifest.json        encoder name/path/prefixes/backend/quantization (int8: the instruction set of the
                         int8 kernels that encoded it), dimension, count, corpus path + sha256, where the
                         vectors came from (encoded, shipped-float16, imported), index type, fp16, FAISS
                         factory string, index.faiss size, created (UTC), format version
    index.faiss          the FAISS index; FAISS id i = row i of the doc store
    docs.arrow           doc store: doc_id, title, text (Arrow IPC, memory-mapped; ``docs.parquet`` in
                         indexes written before; the manifest's ``docstore`` names the file)
    doc_rows.npy         sorted (passage id hash, row) pairs: the doc store's id lookup (optional)
    df_plain.arrow       term, df (document frequency) sorted by term, memory-mapped; metadata n_docs,
    df_terrier.arrow     tokenisation: the plain and Terrier lexicons (see raypipe.retrieval.store);
                         indexes written before them hold corpus_stats.parquet (plain) until
                         ``raypipe index`` adds them (raypipe.retrieval.build.add_missing_lexicons)

A replica serving on the CPU maps the doc store and, for flat indexes (``Flat``/``SQfp16``), the FAISS
index from disk (``faiss.IO_FLAG_MMAP_IFC``) instead of copying them into its heap, so replicas and
stages on one node share the pages (``SearchParams.mmap``); GPU serving (``faiss_gpu``) first checks from the
manifest that the clone's peak fits each GPU's free memory, then adds a flat index's rows from the mapped file
onto the GPUs (:func:`to_gpus`, :mod:`raypipe.retrieval.gpu_memory`).

Loading checks the directory, its files, the size of ``index.faiss`` against the manifest (a truncated
file) and the manifest against the configured encoder (name, quantization, dimension, query prefix) and
raises :class:`IndexNotFoundError` / :class:`IndexMismatchError` before any model or index is loaded; an
int8 index encoded by other int8 kernels than this CPU's is loaded with a warning (:func:`check_encoder`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from raypipe.retrieval.encoders import EncoderSpec, int8_kernel_isa
from raypipe.retrieval.gpu_memory import GpuClonePlan, check_gpu_memory
from raypipe.retrieval.store import LEGACY_STATS_FILE, LEXICON_FILES, CorpusStats, DocStore

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
FAISS_FILE = "index.faiss"
DOCSTORE_FILE = "docs.parquet"  # the doc store of indexes written before docs.arrow
DOCSTORE_ARROW = "docs.arrow"
DOC_ROWS_FILE = "doc_rows.npy"
INDEX_FILES = (MANIFEST, FAISS_FILE)  # plus the manifest's doc store file and the plain statistics
TRAIN_SAMPLE_CAP = 1_000_000  # most vectors an IVF/PQ index is trained on (evenly spaced over the corpus)
TRAIN_POINTS_PER_CENTROID = 64
MIN_POINTS_PER_CENTROID = 39  # FAISS's own warning threshold for k-means training


class RetrievalIndexError(Exception):
    """Base class of index directory errors."""


class IndexNotFoundError(RetrievalIndexError, FileNotFoundError):
    """The index directory or one of its files is missing."""


class IndexMismatchError(RetrievalIndexError, ValueError):
    """The index was built with other settings (encoder, dimension, corpus, index type) than configured."""


@dataclass(frozen=True)
class IndexSettings:
    """How the FAISS index is built (build-time parameters; recorded in the manifest)."""

    index_type: str = "flat"  # flat | ivf | hnsw | pq (= IVF-PQ)
    fp16: bool = False  # store vectors as float16 (flat/ivf/hnsw), halving memory
    ivf_nlist: int | None = None  # None: about 4*sqrt(N), at least 39 training points per list
    pq_m: int | None = None  # PQ sub-quantisers per vector; None: dim // 8
    pq_nbits: int = 8  # bits per sub-quantiser code
    hnsw_m: int = 32

    @property
    def slug(self) -> str:
        return self.index_type + ("-fp16" if self.fp16 else "")

    def nlist(self, n: int) -> int:
        if self.ivf_nlist is not None:
            return self.ivf_nlist
        return max(1, min(int(4 * math.sqrt(n)), n // MIN_POINTS_PER_CENTROID))

    def factory(self, dim: int, n: int) -> str:
        """The faiss.index_factory string for ``n`` vectors of dimension ``dim`` (inner product)."""
        storage = "SQfp16" if self.fp16 else "Flat"
        if self.index_type == "flat":
            return storage
        if self.index_type == "hnsw":
            return f"HNSW{self.hnsw_m},{storage}"
        if self.index_type == "ivf":
            return f"IVF{self.nlist(n)},{storage}"
        if self.index_type == "pq":
            if self.fp16:
                raise ValueError("fp16 does not apply to index_type=pq (PQ stores codes, not floats)")
            m = self.pq_m or max(1, dim // 8)
            if dim % m:
                raise ValueError(f"pq_m={m} must divide the dimension {dim}")
            return f"IVF{self.nlist(n)},PQ{m}x{self.pq_nbits}"
        raise ValueError(f"unknown index_type {self.index_type!r}; use flat, ivf, hnsw or pq")

    def min_training_points(self, n: int, dim: int) -> int:
        if self.index_type == "ivf":
            return self.nlist(n)
        if self.index_type == "pq":
            return max(self.nlist(n), 2**self.pq_nbits)  # centroids per sub-quantiser
        return 0


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def encoder_slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower())


def default_index_dir(cache: Path, corpus_sha256: str, encoder_name: str, settings: IndexSettings) -> Path:
    """``<cache>/indexes/<corpus sha256[:12]>-<encoder>-<type>[-fp16]``."""
    return cache / "indexes" / f"{corpus_sha256[:12]}-{encoder_slug(encoder_name)}-{settings.slug}"


def expected_manifest(
    spec: EncoderSpec, settings: IndexSettings, corpus: Path, corpus_sha256: str, vectors: str | None = None
) -> dict[str, Any]:
    """The manifest fields a build with these settings produces (without count/created/factory).

    ``vectors``: the vector source the build must have (``encoded`` when shipped vectors are not
    allowed); None accepts any (:func:`vector_source`)."""
    query_prefix, passage_prefix = spec.prompts()
    quantization = spec.resolved_quantization
    return {
        "format_version": FORMAT_VERSION,
        "encoder": spec.name,
        "encoder_path": spec.path(),
        "query_prefix": query_prefix,
        "passage_prefix": passage_prefix,
        "max_length": spec.max_length,
        "encoder_backend": spec.resolved_backend,  # informational: fp32 onnx and torch give the same vectors
        "quantization": quantization,
        **({"int8_isa": int8_kernel_isa()} if quantization == "int8" else {}),  # where int8 vectors are reproducible
        **({"vectors": vectors} if vectors else {}),
        "dimension": spec.dimension(),
        "corpus": str(corpus),
        "corpus_sha256": corpus_sha256,
        "index_type": settings.index_type,
        "fp16": settings.fp16,
        "ivf_nlist": settings.ivf_nlist,
        "pq_m": settings.pq_m,
        "pq_nbits": settings.pq_nbits,
        "hnsw_m": settings.hnsw_m,
    }


# Fields that must agree for an existing index to count as "the same build" (corpus path may move). The
# int8 kernels' instruction set is not one: an int8 index on shared storage serves any node (its queries
# are fp32), with a warning where this CPU would encode its passages differently (check_encoder).
BUILD_KEYS = (
    "format_version",
    "encoder",
    "quantization",
    "query_prefix",
    "passage_prefix",
    "max_length",
    "dimension",
    "corpus_sha256",
    "vectors",
    "index_type",
    "fp16",
    "ivf_nlist",
    "pq_m",
    "pq_nbits",
    "hnsw_m",
)
# Fields a searcher needs to agree with: the query encoder must embed into the same space (the same
# model, quantised or not; the backend does not matter, fp32 ONNX and torch give the same vectors).
ENCODER_KEYS = ("encoder", "quantization", "dimension", "query_prefix")
# Values of fields that indexes built before the field existed implicitly have.
MANIFEST_DEFAULTS = {"quantization": "none"}


def vector_source(manifest: dict[str, Any]) -> str:
    """Where an index's vectors came from: ``encoded`` by its encoder, ``shipped-float16`` (the package's
    vectors of the bundled corpus, rounded to float16) or ``imported`` (an existing FAISS file); read from
    the build record of manifests written before the ``vectors`` field."""
    if "vectors" in manifest:
        return manifest["vectors"]
    if "import" in manifest:
        return "imported"
    built = manifest.get("build", {}).get("vectors", {})
    return f"shipped-{built.get('dtype', 'float16')}" if built.get("source") == "shipped" else "encoded"


def manifest_field(manifest: dict[str, Any], key: str) -> Any:
    """A manifest's value of ``key``, with the value indexes written before the field implicitly have."""
    return vector_source(manifest) if key == "vectors" else manifest.get(key, MANIFEST_DEFAULTS.get(key))


def manifest_differences(manifest: dict[str, Any], expected: dict[str, Any], keys=BUILD_KEYS) -> list[str]:
    return [
        f"{key}: index has {manifest_field(manifest, key)!r}, configured {expected[key]!r}"
        for key in keys
        if key in expected and manifest_field(manifest, key) != expected[key]
    ]


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a complete index directory; IndexNotFoundError naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise IndexNotFoundError(f"index directory not found: {path} (build it with `raypipe index`)")
    missing = [name for name in INDEX_FILES if not (path / name).exists()]
    if MANIFEST not in missing:
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except json.JSONDecodeError as exc:
            raise IndexMismatchError(f"{path / MANIFEST}: not valid JSON ({exc.msg})") from None
        if not (path / manifest.get("docstore", DOCSTORE_FILE)).exists():
            missing.append(manifest.get("docstore", DOCSTORE_FILE))
    if not any((path / name).exists() for name in (LEXICON_FILES["plain"], LEGACY_STATS_FILE)):
        missing.append(LEXICON_FILES["plain"])
    if missing:
        raise IndexNotFoundError(
            f"index directory {path} is incomplete: missing {', '.join(missing)} (rebuild with `raypipe index --force`)"
        )
    size = (path / FAISS_FILE).stat().st_size
    if manifest.get("faiss_bytes", size) != size:  # indexes built before the field was recorded have none
        raise IndexMismatchError(
            f"{path / FAISS_FILE} has {size} bytes, the manifest says {manifest['faiss_bytes']}: "
            "truncated or replaced (rebuild with `raypipe index --force`)"
        )
    return manifest


def check_encoder(manifest: dict[str, Any], spec: EncoderSpec, where: Path) -> None:
    """Raise IndexMismatchError if the configured encoder cannot query this index."""
    query_prefix, _ = spec.prompts()
    expected = {
        "encoder": spec.name,
        "quantization": spec.resolved_quantization,
        "dimension": spec.dimension(),
        "query_prefix": query_prefix,
    }
    problems = manifest_differences(manifest, expected, ENCODER_KEYS)
    if problems:
        raise IndexMismatchError(f"index {where} does not match the configured encoder: " + "; ".join(problems))
    here, there = int8_kernel_isa(), manifest.get("int8_isa")
    if manifest_field(manifest, "quantization") == "int8" and there != here:
        made_by = (
            f"other int8 kernels than this CPU's ({there} there, {here} here)"
            if there
            else (f"int8 kernels it does not record (built before the manifest did; this CPU's: {here})")
        )
        log.warning(
            "index %s holds int8 passage vectors made by %s: its queries are encoded in fp32, alike on every CPU, "
            "so searches return this index's results; but the same index built here may hold other vectors (cosine "
            "~0.99) and rank differently. For results any machine reproduces, use the fp32 encoder "
            "(retrieval.encoder_quantization=none) and rebuild.",
            where,
            made_by,
        )


def train_sample_rows(n: int, settings: IndexSettings, dim: int) -> np.ndarray:
    """The rows an IVF/PQ index is trained on: all of them up to the cap, else evenly spaced ones."""
    needed = settings.min_training_points(n, dim)
    size = min(n, max(needed * TRAIN_POINTS_PER_CENTROID, 100_000), max(TRAIN_SAMPLE_CAP, needed))
    return np.arange(n) if size >= n else np.linspace(0, n - 1, size).astype(np.int64)


def build_faiss_chunked(
    chunks: Callable[[], Iterable[np.ndarray]],
    n: int,
    dim: int,
    settings: IndexSettings,
    sample: Callable[[np.ndarray], np.ndarray] | None = None,
    progress=None,
):
    """A trained, filled FAISS inner-product index over L2-normalised float32 rows, added chunk by chunk.

    ``chunks()`` yields the rows in order; ``sample(rows)`` returns the given rows (for training; only
    called by index types that train). The result equals adding all rows at once."""
    import faiss

    factory = settings.factory(dim, n)
    needed = settings.min_training_points(n, dim)
    if n < needed:
        raise ValueError(f"index_type={settings.index_type} needs at least {needed} passages to train, corpus has {n}")
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        rows = train_sample_rows(n, settings, dim)
        index.train(np.ascontiguousarray(sample(rows), dtype=np.float32))
    if isinstance(index, faiss.IndexFlatCodes):
        # reserve the codes once: growing them add by add doubles the buffer, and while it is copied the
        # old and the new buffer are both resident (up to 1.5-2x the index bytes at the peak)
        index.codes.resize(n * index.code_size)
        index.codes.resize(0)
    for chunk in chunks():
        index.add(np.ascontiguousarray(chunk, dtype=np.float32))
        if progress is not None:
            progress.advance(len(chunk))
    if index.ntotal != n:
        raise RuntimeError(f"FAISS index has {index.ntotal} rows after adding, expected {n}")
    return index, factory


def build_faiss(embeddings: np.ndarray, settings: IndexSettings):
    """:func:`build_faiss_chunked` over one in-memory matrix."""
    n, dim = embeddings.shape
    return build_faiss_chunked(lambda: [embeddings], n, dim, settings, sample=lambda rows: embeddings[rows])


def finish_index_dir(tmp: Path, target: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest into the complete temporary directory ``tmp`` and rename it to ``target``."""
    import shutil

    full = {
        **manifest,
        "vectors": vector_source(manifest),
        "faiss_bytes": (tmp / FAISS_FILE).stat().st_size,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (tmp / MANIFEST).write_text(json.dumps(full, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


@dataclass
class SearchParams:
    """Search-time parameters (not part of the build)."""

    nprobe: int = 16
    hnsw_ef_search: int = 128
    faiss_gpu: str = "none"  # none | shard | replicate: move the index onto all visible GPUs
    mmap: bool = True  # CPU: map flat indexes from disk (shared pages) instead of reading them into the heap


class IndexDir:
    """A loaded index directory. The doc store and statistics load lazily, FAISS only when searched."""

    def __init__(self, path: str | Path, spec: EncoderSpec | None = None):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if spec is not None:
            check_encoder(self.manifest, spec, self.path)

    @cached_property
    def docs(self) -> DocStore:
        return DocStore.read(self.path / self.manifest.get("docstore", DOCSTORE_FILE), self.path / DOC_ROWS_FILE)

    @cached_property
    def stats(self) -> CorpusStats:
        return CorpusStats.read(self.path)

    def faiss_index(self, params: SearchParams | None = None):
        """Read the FAISS index and apply search parameters (and the GPU option)."""
        import faiss

        params = params or SearchParams()
        if params.faiss_gpu != "none":
            self.check_gpu_memory(params.faiss_gpu == "shard")
        # a GPU clone of a flat index adds its rows from the mapped file
        index = self._read_faiss(mapped=params.faiss_gpu != "none" or params.mmap)
        if index.ntotal != self.manifest["count"] or index.d != self.manifest["dimension"]:
            raise IndexMismatchError(
                f"{self.path}: FAISS index has {index.ntotal} x {index.d}, manifest says "
                f"{self.manifest['count']} x {self.manifest['dimension']} (rebuild with --force)"
            )
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.nprobe = params.nprobe
        if isinstance(index, faiss.IndexHNSW):
            index.hnsw.efSearch = params.hnsw_ef_search
        if params.faiss_gpu != "none":
            index = to_gpus(index, shard=params.faiss_gpu == "shard")
        return index

    def check_gpu_memory(self, shard: bool, gpus: int | None = None, free: list[int] | None = None) -> None:
        """Refuse (:class:`GpuMemoryError`, one line with the numbers) before the index file is read, if the
        clone's peak on a GPU (:class:`GpuClonePlan`, from the manifest) exceeds that GPU's free memory.
        ``gpus`` and ``free`` default to the visible GPUs and what they have free."""
        if gpus is None:
            import faiss

            gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        plan = gpu_plan(self.manifest, gpus, shard) if gpus else None
        if plan is None:
            return
        free = free if free is not None else free_gpu_memory(gpus)
        if free is None:
            log.warning(
                "cannot read the GPUs' free memory (no CUDA torch, no nvidia-smi): cloning %s unchecked", self.path
            )
            return
        check_gpu_memory(plan, free, where=f"index {self.path}")

    def vectors(self, rows) -> np.ndarray:
        """Stored passage vectors for FAISS row ids (exact for flat indexes; approximate for PQ)."""
        import faiss

        index = self._read_faiss(mapped=True)
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.make_direct_map()
        return np.stack([index.reconstruct(int(r)) for r in rows]).astype(np.float32)

    def _read_faiss(self, mapped: bool):
        return read_faiss(self.path / FAISS_FILE, mapped)


def read_faiss(path: Path, mapped: bool = True):
    """``faiss.read_index``; with ``mapped``, flat indexes (IndexFlat, SQfp16: FAISS's IndexFlatCodes)
    are mapped from disk (their codes stay in the page cache, shared between processes); FAISS reads
    other types into memory whatever the flag."""
    import faiss

    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mapped else 0)


FLAT_FACTORIES = ("Flat", "SQfp16")  # flat indexes: cloned row by row (gpu_memory), checked before reading


def gpu_plan(manifest: dict[str, Any], gpus: int, shard: bool) -> GpuClonePlan | None:
    """The clone of this index onto ``gpus`` GPUs (float16 store); None for indexes faiss's cloner moves
    (IVF, PQ: not flat)."""
    factory = manifest.get("factory") or ("Flat" if manifest.get("index_type", "flat") == "flat" else None)
    if factory not in FLAT_FACTORIES:
        return None
    return GpuClonePlan(count=int(manifest["count"]), dim=int(manifest["dimension"]), gpus=gpus, shard=shard)


def free_gpu_memory(gpus: int) -> list[int] | None:
    """Free bytes of each of the ``gpus`` visible GPUs: torch's view when it sees CUDA, else ``nvidia-smi``'s
    (faiss's Python has no such call) for the ids ``CUDA_VISIBLE_DEVICES`` names; None when neither answers."""
    import os
    import subprocess

    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= gpus:
            return [int(torch.cuda.mem_get_info(i)[0]) for i in range(gpus)]
    except ImportError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    free = {i.strip(): int(mib) * 1024**2 for i, mib in (line.split(",") for line in out.strip().splitlines())}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else sorted(free, key=int)
    return [free[i] for i in ids[:gpus]] if all(i in free for i in ids[:gpus]) and len(ids) >= gpus else None


def to_gpus(index, shard: bool, fp16: bool = True, gpu=None):
    """Spread an index over all visible GPUs (faiss-gpu): sharded (each GPU holds 1/n of the rows, in order,
    so FAISS id i stays row i) or replicated (a full copy on each).

    Vectors are held in float16 on the GPUs by default, as Search-R1's retrieval server does. Flat indexes
    (IndexFlat, SQfp16) are built on each GPU as an empty ``GpuIndexFlat`` filled by one ``add`` of its rows,
    which faiss reserves once and pages (:mod:`raypipe.retrieval.gpu_memory`): the peak is the store plus a
    page, not faiss's cloner's float32 and float16 copies of every row. The rows come straight from the mapped
    file for IndexFlat (no copy in the heap), decoded per GPU for SQfp16. Other index types go through
    faiss's cloner. ``gpu``: the faiss namespace with the GPU classes (tests pass a fake).
    """
    import faiss

    gpu = gpu or faiss
    if not hasattr(gpu, "GpuMultipleClonerOptions") or gpu.get_num_gpus() == 0:
        raise RuntimeError("retrieval.index.faiss_gpu needs faiss-gpu and at least one visible GPU")
    n_gpus = gpu.get_num_gpus()
    if not (
        isinstance(index, faiss.IndexFlat)
        or (isinstance(index, faiss.IndexScalarQuantizer) and index.sq.qtype == faiss.ScalarQuantizer.QT_fp16)
    ):
        options = gpu.GpuMultipleClonerOptions()
        options.shard = shard
        options.useFloat16 = fp16
        return gpu.index_cpu_to_all_gpus(index, co=options)
    n, d = index.ntotal, index.d
    if shard:
        bounds = [n * g // n_gpus for g in range(n_gpus + 1)]
        ranges = list(zip(bounds[:-1], bounds[1:]))
    else:
        ranges = [(0, n)] * n_gpus
    mapped = faiss.rev_swig_ptr(index.get_xb(), n * d).reshape(n, d) if isinstance(index, faiss.IndexFlat) else None
    parts = []
    for device, (start, stop) in enumerate(ranges):
        resources = gpu.StandardGpuResources()
        config = gpu.GpuIndexFlatConfig()
        config.device = device
        config.useFloat16 = fp16
        part = gpu.GpuIndexFlat(resources, d, index.metric_type, config)
        rows = mapped[start:stop] if mapped is not None else index.reconstruct_n(start, stop - start)
        if stop > start:
            part.add(rows)  # one call: faiss reserves the store once and adds it page by page
        log.info("GPU %d holds rows %d-%d of %d (%s)", device, start, stop, n, "float16" if fp16 else "float32")
        parts.append((resources, part))
        del rows
    if n_gpus == 1:
        combined = parts[0][1]
    else:
        combined = gpu.IndexShards(d, True, True) if shard else gpu.IndexReplicas(d, True)
        for _, part in parts:
            combined.add_shard(part) if shard else combined.add_replica(part)
    combined.referenced_objects = parts  # the GPU indexes and their resources live as long as the result
    return combined


def load_index_dir(path: str | Path, spec: EncoderSpec | None = None) -> IndexDir:
    """Open an index directory (checking the encoder when ``spec`` is given)."""
    return IndexDir(path, spec)
