"""Write the index directory for a run configuration, block by block, without Ray.

The build is streamed so that no process holds the corpus and driver memory does not grow with it:

1. :func:`plan_blocks` scans the corpus once for the byte offsets of every ``block_rows``-th line (a
   block is a range of corpus rows: its rows, bytes and first line number), recorded in the build
   directory (``.<index>.build/plan.json``).
2. The blocks not yet written are read, counted (document frequencies), encoded (longest passage first
   inside each block) and written to ``blocks/`` as they arrive: ``NNNNNN.docs.arrow`` (the block's
   doc-store rows), ``NNNNNN.df.arrow`` (its document frequencies in both lexicons) and ``NNNNNN.npy``
   (its embeddings, renamed into place last: a block is complete when its ``.npy`` exists). The encode
   function does this (:func:`local_encode_blocks` in this process; the index job passes a Ray Data pipeline,
   :mod:`raypipe.runtime.index_build`). A rerun after an interruption keeps every complete block and encodes
   only the rest; a plan made for another corpus or other settings is discarded.
3. :func:`assemble_index` builds FAISS from the blocks chunk by chunk: a flat index is written to its file
   block by block (:func:`stream_flat_index`: one block in memory, whatever the corpus size); IVF/PQ/HNSW are
   built in memory (IVF/PQ trained on a sample first) and then written. It appends the blocks' rows to the doc
   store, merges the frequencies, writes the sorted id lookup, and renames the finished directory into place.
   Because the blocks and their order are fixed by the plan, the index equals an uninterrupted build's (same
   row order, same vectors).

:func:`up_to_date` says whether a directory already holds the build.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.core.config import DataConfig, RetrievalConfig, RunConfig
from raypipe.core.models import cache_dir
from raypipe.core.progress import Progress
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus
from raypipe.retrieval.encoders import Encoder, EncoderSpec, passage_text
from raypipe.retrieval.index import (
    BUILD_KEYS,
    DOC_ROWS_FILE,
    DOCSTORE_ARROW,
    FAISS_FILE,
    MANIFEST,
    IndexMismatchError,
    IndexSettings,
    SearchParams,
    build_faiss_chunked,
    default_index_dir,
    file_sha256,
    finish_index_dir,
    load_index_dir,
    manifest_differences,
    read_manifest,
)
from raypipe.retrieval.store import (
    DOCSTORE_SCHEMA,
    LEXICON_FILES,
    TOKENISATION,
    FrequencyMerger,
    check_unique_ids,
    doc_id_hashes,
    document_frequencies,
    passages_table,
    sorted_doc_rows,
    table_passages,
)

log = logging.getLogger(__name__)
ENCODE_LINE_EVERY_S = 10.0  # seconds between the encode loops' progress lines
PLAN_FILE = "plan.json"
BLOCKS_DIR = "blocks"


def encoder_spec(cfg: RetrievalConfig, threads: int | None = None) -> EncoderSpec:
    return EncoderSpec(
        ref=cfg.encoder,
        prefixes=cfg.encoder_prefixes,
        max_length=cfg.max_length,
        batch_size=min(cfg.encode.batch_size, 128),
        threads=threads,
        backend=cfg.encoder_backend,
        quantization=cfg.encoder_quantization,
    )


def index_settings(cfg: RetrievalConfig) -> IndexSettings:
    return IndexSettings(
        index_type=cfg.index.type,
        fp16=cfg.index.fp16,
        ivf_nlist=cfg.index.ivf_nlist,
        pq_m=cfg.index.pq_m,
        pq_nbits=cfg.index.pq_nbits,
        hnsw_m=cfg.index.hnsw_m,
    )


def search_params(cfg: RetrievalConfig) -> SearchParams:
    return SearchParams(
        nprobe=cfg.index.nprobe,
        hnsw_ef_search=cfg.index.hnsw_ef_search,
        faiss_gpu=cfg.index.faiss_gpu,
        mmap=cfg.index.mmap,
    )


def corpus_path(data: DataConfig) -> Path:
    return BUNDLED_CORPUS if data.corpus == "bundled" else Path(data.corpus).expanduser()


def index_dir_for(config: RunConfig, corpus_sha256: str | None = None, spec: EncoderSpec | None = None) -> Path:
    """The configured index directory, or the default one in the cache keyed by corpus and settings
    (``corpus_sha256`` and ``spec``: the corpus hash and ``encoder_spec(config.retrieval)``, where known)."""
    if config.retrieval.index.dir:
        return Path(config.retrieval.index.dir).expanduser()
    sha = corpus_sha256 or file_sha256(corpus_path(config.data))
    name = (spec or encoder_spec(config.retrieval)).name
    return default_index_dir(cache_dir(), sha, name, index_settings(config.retrieval))


def up_to_date(target: Path, expected: dict, force: bool) -> bool:
    """True if ``target`` holds this exact build; raises if it holds something else (unless ``force``).
    An index of this build written before the mapped lexicon tables gets them (:func:`add_missing_lexicons`)."""
    if not target.exists():
        return False
    if (target / MANIFEST).exists():
        if force:
            return False
        problems = manifest_differences(read_manifest(target), expected)
        if problems:
            raise IndexMismatchError(
                f"index {target} was built differently: {'; '.join(problems)} (rebuild with --force)"
            )
        log.info("index %s is up to date (corpus %s), nothing to encode", target, expected["corpus_sha256"][:12])
        add_missing_lexicons(target)
        return True
    if any(target.iterdir()):
        raise IndexMismatchError(f"{target} exists and is not an index directory; refusing to overwrite it")
    return False


def add_missing_lexicons(target: Path, chunk_rows: int = 10_000) -> None:
    """Write the lexicon tables (``df_plain.arrow``, ``df_terrier.arrow``) an index written before them
    lacks, counted from its doc store ``chunk_rows`` passages at a time; nothing is re-encoded.

    Two jobs doing it at once write the same bytes (each file is renamed into place). An index directory
    that cannot be written is left as it is, with a warning: the features' seed NQC then names this fix."""
    missing = [lexicon for lexicon, name in LEXICON_FILES.items() if not (target / name).exists()]
    if not missing:
        return
    start = time.perf_counter()
    docs = load_index_dir(target).docs.table
    log.info(
        "index %s: counting the %s document frequencies from its %d passages",
        target,
        " and ".join(missing),
        docs.num_rows,
    )
    merger = FrequencyMerger()
    for batch in docs.to_batches(max_chunksize=chunk_rows):
        merger.add(*document_frequencies(table_passages(batch)))
    try:
        terms = merger.write(target, missing)
    except OSError as exc:
        log.warning("index %s: could not add the lexicon tables (%s)", target, exc)
        return
    log.info("index %s: added the lexicon tables (terms: %s) in %.1f s", target, terms, time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Block:
    """A range of corpus rows: ``n_rows`` passages from row ``start``, the bytes ``[byte_start,
    byte_end)`` of the file, whose first line is ``first_lineno`` (for error messages)."""

    index: int
    start: int
    n_rows: int
    byte_start: int
    byte_end: int
    first_lineno: int

    @property
    def name(self) -> str:
        return f"{self.index:06d}"


@dataclass
class EncodedBlock:
    block: Block
    docs: pa.Table  # DOCSTORE_SCHEMA rows in corpus order
    df: pa.Table  # (term, df) over the block
    embeddings: np.ndarray  # float32, one row per passage, in corpus order
    cpu_s: float  # the encoder's CPU-seconds for this block


# (spec, corpus, blocks to encode) -> the encoded blocks, in any order, as they are done
EncodeBlocks = Callable[[EncoderSpec, Path, list[Block]], Iterable[EncodedBlock]]


def plan_blocks(corpus: Path, block_rows: int) -> list[Block]:
    """Cut the corpus into blocks of ``block_rows`` passages (blank lines are not rows), streaming."""
    blocks: list[Block] = []
    start_byte, start_line, rows, pos = 0, 1, 0, 0
    with corpus.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if rows == 0:
                start_byte, start_line = pos, lineno
            pos += len(raw)
            if raw.strip():
                rows += 1
                if rows == block_rows:
                    blocks.append(Block(len(blocks), len(blocks) * block_rows, rows, start_byte, pos, start_line))
                    rows = 0
    if rows:
        blocks.append(Block(len(blocks), len(blocks) * block_rows, rows, start_byte, pos, start_line))
    return blocks


def read_block(corpus: Path, block: Block) -> tuple[pa.Table, pa.Table]:
    """A block's doc-store rows and its document frequencies (lines validated as :func:`iter_corpus`)."""
    passages = list(iter_corpus(corpus, (block.byte_start, block.byte_end, block.first_lineno)))
    if len(passages) != block.n_rows:
        raise RuntimeError(
            f"{corpus}: block {block.index} has {len(passages)} passages, planned {block.n_rows} "
            "(the file changed during the build?)"
        )
    df, _ = document_frequencies(passages)
    return passages_table(passages), df


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


def encode_docs(encoder: Encoder, docs: pa.Table, call_rows: int) -> tuple[np.ndarray, float]:
    """A block's embeddings in its row order, encoded longest first in calls of ``call_rows``; and the CPU-seconds."""
    cpu = time.process_time()
    order = length_order(docs)
    ordered = docs.take(order)
    out: np.ndarray | None = None
    for offset in range(0, docs.num_rows, call_rows):
        part = encoder.encode_passages(batch_texts(ordered.slice(offset, call_rows).to_pydict()))
        if out is None:
            out = np.empty((docs.num_rows, part.shape[1]), dtype=np.float32)
        out[order[offset : offset + len(part)]] = part
    assert out is not None
    return out, time.process_time() - cpu


def local_encode_blocks(
    spec: EncoderSpec, corpus: Path, blocks: list[Block], call_rows: int = 256
) -> Iterator[EncodedBlock]:
    """Read and encode blocks one after another in this process (tests, small corpora)."""
    encoder = spec.load()
    for block in blocks:
        docs, df = read_block(corpus, block)
        embeddings, cpu_s = encode_docs(encoder, docs, call_rows)
        yield EncodedBlock(block, docs, df, embeddings, cpu_s)


# ---------------------------------------------------------------------------------------- build directory


class BuildDir:
    """The build directory of one index: its plan and the blocks written so far."""

    def __init__(self, path: Path, blocks: list[Block]):
        self.path = path
        self.blocks = blocks

    @classmethod
    def open(cls, target: Path, manifest: dict, block_rows: int) -> BuildDir:
        """Resume the build directory of ``target`` if it was planned for this build, else plan afresh."""
        path = target.with_name(f".{target.name}.build")
        key = {"build": {k: manifest.get(k) for k in BUILD_KEYS}, "block_rows": block_rows}
        plan_file = path / PLAN_FILE
        if plan_file.exists():
            plan = json.loads(plan_file.read_text())
            if {k: plan.get(k) for k in key} == key:
                build = cls(path, [Block(**b) for b in plan["blocks"]])
                log.info(
                    "resuming the build in %s: %d of %d blocks already written",
                    path,
                    len(build.done()),
                    len(build.blocks),
                )
                return build
            log.info("discarding %s: planned for another corpus or other settings", path)
        if path.exists():
            shutil.rmtree(path)
        (path / BLOCKS_DIR).mkdir(parents=True)
        start = time.perf_counter()
        blocks = plan_blocks(Path(manifest["corpus"]), block_rows)
        if not blocks:
            raise ValueError(f"corpus {manifest['corpus']} has no passages")
        tmp = plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**key, "blocks": [asdict(b) for b in blocks]}) + "\n")
        tmp.rename(plan_file)
        log.info(
            "planned %d blocks of up to %d passages (%d passages, %.1f s)",
            len(blocks),
            block_rows,
            sum(b.n_rows for b in blocks),
            time.perf_counter() - start,
        )
        return cls(path, blocks)

    def file(self, block: Block, kind: str) -> Path:
        return self.path / BLOCKS_DIR / f"{block.name}.{kind}"

    def done(self) -> set[int]:
        return {b.index for b in self.blocks if self.file(b, "npy").exists()}

    def pending(self) -> list[Block]:
        done = self.done()
        return [b for b in self.blocks if b.index not in done]

    def write(self, encoded: EncodedBlock) -> None:
        """Write one block (the embeddings last, so a block on disk is complete)."""
        block = encoded.block
        if encoded.embeddings.shape[0] != block.n_rows or encoded.docs.num_rows != block.n_rows:
            raise RuntimeError(
                f"block {block.index}: {encoded.embeddings.shape[0]} vectors and "
                f"{encoded.docs.num_rows} rows for {block.n_rows} passages"
            )
        for kind, table in (("docs.arrow", encoded.docs), ("df.arrow", encoded.df)):
            _write_ipc(table, self.file(block, kind))
        tmp = self.file(block, "npy.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(encoded.embeddings, dtype=np.float32))
        os.replace(tmp, self.file(block, "npy"))

    def embeddings(self, block: Block) -> np.ndarray:
        return np.load(self.file(block, "npy"), mmap_mode="r")

    def table(self, block: Block, kind: str) -> pa.Table:
        return pa.ipc.open_file(pa.memory_map(str(self.file(block, kind)))).read_all()

    def frequencies(self, block: Block) -> pa.Table:
        """The block's (lexicon, term, df); a block written before the Terrier lexicon existed (no
        ``lexicon`` column) is counted again from its doc-store rows."""
        table = self.table(block, "df.arrow")
        if "lexicon" in table.schema.names:
            return table
        return document_frequencies(table_passages(self.table(block, "docs.arrow")))[0]


def _write_ipc(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def build_index(
    config: RunConfig,
    target: Path,
    manifest: dict,
    encode: EncodeBlocks | None = None,
    assemble: Callable[..., Path] | None = None,
    vectors: dict | None = None,
    spec: EncoderSpec | None = None,
) -> Path:
    """Write the index of ``manifest``'s corpus to ``target``, resuming an interrupted build.

    ``encode`` defaults to :func:`local_encode_blocks`; ``assemble`` (``assemble_index``'s signature)
    to :func:`assemble_index` in this process (the index job runs it as a Ray task, off the driver).
    ``vectors``: where the vectors came from, for the manifest (default: encoded by ``encode``).
    ``spec``: ``encoder_spec(config.retrieval)``, where the caller has it."""
    cfg = config.retrieval
    corpus = Path(manifest["corpus"])
    start = time.perf_counter()
    work = BuildDir.open(target, manifest, cfg.encode.block_rows)
    pending = work.pending()
    prepare_s = time.perf_counter() - start
    spec = spec or encoder_spec(cfg)
    spec.prepare()  # export / quantise the ONNX model once here, not in every actor
    todo = sum(b.n_rows for b in pending)
    progress = Progress("passages", todo, label="encode", every_s=ENCODE_LINE_EVERY_S, log=log)
    start = time.perf_counter()
    cpu_s = 0.0
    for encoded in (encode or local_encode_blocks)(spec, corpus, pending):
        work.write(encoded)
        cpu_s += encoded.cpu_s
        progress.advance(encoded.block.n_rows)
    encode_s = time.perf_counter() - start
    missing = work.pending()
    if missing:
        raise RuntimeError(f"{len(missing)} blocks were not encoded (first: block {missing[0].index})")
    vectors = vectors or {"source": "encoded"}
    log.info(
        "%s %d passages in %d blocks with %s in %.1f s (%.0f passages/s; %d blocks kept from before)",
        "encoded" if vectors["source"] == "encoded" else f"took {vectors['source']} vectors of",
        todo,
        len(pending),
        spec.name,
        encode_s,
        todo / max(encode_s, 1e-9),
        len(work.blocks) - len(pending),
    )
    # encode_cpu_seconds: the encoders' CPU time (Ray: the actors'), steadier than wall on a shared machine
    timing = {
        "prepare_seconds": round(prepare_s, 2),
        "encode_seconds": round(encode_s, 2),
        "encode_cpu_seconds": round(cpu_s, 2),
        "passages_encoded": todo if vectors["source"] == "encoded" else 0,
        "vectors": vectors,
    }
    return (assemble or assemble_index)(
        work.path, work.blocks, target, {**manifest, "build": timing}, index_settings(cfg)
    )


def assemble_index(work_path: Path, blocks: list[Block], target: Path, manifest: dict, settings: IndexSettings) -> Path:
    """Build the index directory from a complete build directory, one block in memory at a time
    (plus the FAISS index itself), then remove the build directory."""
    work = BuildDir(Path(work_path), blocks)
    n = sum(b.n_rows for b in blocks)
    dim = int(work.embeddings(blocks[0]).shape[1])
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    start = time.perf_counter()
    offsets = np.cumsum([0] + [b.n_rows for b in blocks])

    def sample(rows: np.ndarray) -> np.ndarray:
        parts = []
        for b, lo, hi in zip(blocks, offsets[:-1], offsets[1:]):
            inside = rows[(rows >= lo) & (rows < hi)] - lo
            if len(inside):
                parts.append(np.asarray(work.embeddings(b)[inside]))
        return np.concatenate(parts)

    progress = Progress("vectors", n, label="faiss add", every_s=ENCODE_LINE_EVERY_S, log=log)
    chunks = lambda: (work.embeddings(b) for b in blocks)  # noqa: E731
    factory = stream_flat_index(chunks, n, dim, settings, tmp / FAISS_FILE, progress)
    if factory is None:  # an index that trains or links its rows: built in memory, then written
        index, factory = build_faiss_chunked(chunks, n, dim, settings, sample, progress)
        import faiss

        faiss.write_index(index, str(tmp / FAISS_FILE))
        del index
    faiss_s = time.perf_counter() - start
    merger = FrequencyMerger()
    for b in blocks:
        merger.add(work.frequencies(b), b.n_rows)
    terms = merger.write(tmp)
    write_doc_store((work.table(b, "docs.arrow") for b in blocks), n, tmp)
    log.info("assembled %d passages (terms: %s) in %.1f s", n, terms, time.perf_counter() - start)
    full = {
        **manifest,
        "build": {**manifest.get("build", {}), "faiss_seconds": round(faiss_s, 2), "blocks": len(blocks)},
        "count": n,
        "dimension": dim,
        "factory": factory,
        "n_docs": merger.n_docs,
        "docstore": DOCSTORE_ARROW,
        "tokenisation": TOKENISATION,
    }
    finish_index_dir(tmp, target, full)
    shutil.rmtree(work.path, ignore_errors=True)
    return target


def stream_flat_index(
    chunks: Callable[[], Iterable[np.ndarray]],
    n: int,
    dim: int,
    settings: IndexSettings,
    path: Path,
    progress: Progress | None = None,
) -> str | None:
    """Write a flat index (``flat``, ``flat`` fp16) of the ``n`` rows ``chunks()`` yields to ``path`` one chunk
    at a time, so no process holds all vectors (wiki-18's flat fp32 index is 64.6 GB); returns its factory
    string, or None for an index type that is not flat (it trains, or links rows: built in memory).

    The file is the one ``faiss.write_index`` writes for the filled index, byte for byte: faiss's own
    serialisation of the empty index (its header, with ``ntotal`` at bytes 8-16, ends with the 8-byte length of
    the codes), ``ntotal`` and that length set for ``n`` rows, then each chunk's codes (``sa_encode``)."""
    import faiss

    factory = settings.factory(dim, n)
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not (isinstance(index, faiss.IndexFlatCodes) and index.is_trained):
        return None
    empty = faiss.serialize_index(index).tobytes()
    one = faiss.clone_index(index)
    one.add(np.zeros((1, dim), dtype=np.float32))
    single = faiss.serialize_index(one).tobytes()
    head = len(empty) - 8
    changed = [i for i in range(head) if empty[i] != single[i]]
    length_one = int.from_bytes(single[head : head + 8], "little")
    if any(not 8 <= i < 16 for i in changed) or len(single) != head + 8 + index.code_size or not length_one:
        raise RuntimeError(f"faiss {faiss.__version__} writes {factory} in a layout the streamed build does not know")
    unit = index.code_size // length_one  # the codes' length counts bytes (SQ) or floats (flat fp32)
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "wb") as out:
        length = n * index.code_size // unit
        out.write(empty[:8] + n.to_bytes(8, "little") + empty[16:head] + length.to_bytes(8, "little"))
        for chunk in chunks():
            codes = index.sa_encode(np.ascontiguousarray(chunk, dtype=np.float32))
            out.write(codes.tobytes())
            written += len(chunk)
            if progress is not None:
                progress.advance(len(chunk))
    if written != n:
        raise RuntimeError(f"FAISS index has {written} rows after adding, expected {n}")
    os.replace(tmp, path)
    return factory


def write_doc_store(tables: Iterable[pa.Table], n: int, out: Path) -> None:
    """``docs.arrow`` (the tables' rows appended in order, one record batch per block) and the sorted id
    lookup ``doc_rows.npy``, for ``n`` passages in all; an id that occurs twice is a DataError naming both rows."""
    hashes = np.empty(n, dtype=np.uint64)
    row = 0
    with pa.OSFile(str(out / DOCSTORE_ARROW), "wb") as sink, pa.ipc.new_file(sink, DOCSTORE_SCHEMA) as writer:
        for table in tables:
            writer.write_table(table)
            hashes[row : row + table.num_rows] = doc_id_hashes(table.column("doc_id").to_pylist())
            row += table.num_rows
    if row != n:
        raise RuntimeError(f"doc store has {row} rows, expected {n}")
    doc_rows = sorted_doc_rows(hashes)
    del hashes
    docs = pa.ipc.open_file(pa.memory_map(str(out / DOCSTORE_ARROW))).read_all().column("doc_id")
    check_unique_ids(doc_rows, lambda r: docs[r].as_py())
    np.save(out / DOC_ROWS_FILE, doc_rows)
