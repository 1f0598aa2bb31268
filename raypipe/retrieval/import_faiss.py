"""Turn an existing FAISS index over a corpus file into a raypipe index directory, without re-encoding.

The published Search-R1 / FlashRAG index (``e5_Flat.index``: a flat inner-product index whose row i is
line i of ``wiki-18.jsonl``, e5-base-v2 with mean pooling and the ``passage: `` prefix) is the case this
is for: :func:`import_faiss` checks that the index's row count equals the corpus's passage count and
its dimension the encoder's, re-encodes a random sample of passages with the named encoder and requires
each to match its stored row (cosine at least ``min_cosine``; a wrong encoder, prefix or pooling fails,
naming the rows), then writes the doc store and statistics (both lexicons) from the corpus and links
(or copies) the FAISS file in. The manifest records the import: the source file's path, size and sha256, and the
verification's result.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raypipe.core.progress import Progress
from raypipe.retrieval.build import Block, encode_docs, plan_blocks, read_block, write_doc_store
from raypipe.retrieval.encoders import Encoder, EncoderSpec
from raypipe.retrieval.index import (
    FAISS_FILE,
    IndexMismatchError,
    IndexSettings,
    expected_manifest,
    file_sha256,
    finish_index_dir,
    read_faiss,
)
from raypipe.retrieval.store import TOKENISATION, FrequencyMerger

log = logging.getLogger(__name__)
VERIFY_SAMPLE = 64
VERIFY_MIN_COSINE = 0.99  # fp16 GPU vs fp32 CPU encodings of e5 agree far closer; int8 would not pass


class ImportVerificationError(IndexMismatchError):
    """Re-encoded sample passages do not match their stored rows (wrong encoder, prefix or pooling)."""


def imported_settings(index) -> tuple[IndexSettings, str]:
    """The build settings and factory string an existing FAISS index corresponds to (flat only)."""
    import faiss

    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise IndexMismatchError(
            "the index uses L2 distance; raypipe searches by inner product (import an IndexFlatIP)"
        )
    if type(index) is faiss.IndexFlatIP or type(index) is faiss.IndexFlat:
        return IndexSettings("flat"), "Flat"
    if isinstance(index, faiss.IndexScalarQuantizer) and index.sq.qtype == faiss.ScalarQuantizer.QT_fp16:
        return IndexSettings("flat", fp16=True), "SQfp16"
    raise IndexMismatchError(
        f"cannot import a {type(index).__name__}: only flat inner-product indexes (IndexFlatIP, SQfp16)"
    )


def read_rows(corpus: Path, blocks: list[Block], rows: np.ndarray) -> pa.Table:
    """The doc-store rows of corpus rows ``rows`` (ascending), reading only the blocks that hold them."""
    parts = []
    for block in blocks:
        inside = rows[(rows >= block.start) & (rows < block.start + block.n_rows)]
        if len(inside):
            parts.append(read_block(corpus, block)[0].take(inside - block.start))
    return pa.concat_tables(parts)


def cosines(stored: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Row-wise cosine in float64 (float32 sums carry about 1e-7 of noise, the size of what is checked)."""
    a, b = np.asarray(stored, dtype=np.float64), np.asarray(fresh, dtype=np.float64)
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)


def verify_sample(
    stored: Callable[[np.ndarray], np.ndarray],
    corpus: Path,
    blocks: list[Block],
    spec: EncoderSpec,
    size: int = VERIFY_SAMPLE,
    min_cosine: float = VERIFY_MIN_COSINE,
    seed: int = 0,
    encoder: Encoder | None = None,
    docs: pa.Table | None = None,
) -> dict[str, Any]:
    """Re-encode ``size`` random passages and compare them with their stored rows (cosine); ``stored``
    gives the stored vectors of corpus rows (ascending row numbers). ``encoder``: ``spec``'s, if loaded;
    ``docs``: the corpus's doc-store rows, if read (else the blocks holding the sample are)."""
    n = sum(b.n_rows for b in blocks)
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(size, n), replace=False))
    taken = docs.take(rows) if docs is not None else read_rows(corpus, blocks, rows)
    fresh, _ = encode_docs(encoder or spec.load(), taken, 64)
    stored_m = np.asarray(stored(rows), dtype=np.float32)
    found = cosines(stored_m, fresh)
    result = {
        "verified": bool((found >= min_cosine).all()),
        "sample_rows": len(rows),
        "min_cosine_required": min_cosine,
        "cosine_min": round(float(found.min()), 9),
        "cosine_mean": round(float(found.mean()), 9),
        "stored_norm_mean": round(float(np.linalg.norm(stored_m, axis=1).mean()), 6),
        "seed": seed,
    }
    if not result["verified"]:
        ids = taken.column("doc_id").to_pylist()
        bad = [f"row {int(r)} (id {d!r}): cosine {c:.6f}" for r, d, c in zip(rows, ids, found) if c < min_cosine]
        raise ImportVerificationError(
            f"{len(bad)} of {len(rows)} sampled passages re-encoded with {spec.name} (query/passage prefixes "
            f"{spec.prompts()!r}, max_length {spec.max_length}) do not match their stored vectors (cosine < "
            f"{min_cosine}): {'; '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}. The vectors were made with "
            "another encoder, prefix or pooling, or their rows are not the corpus's lines in order"
        )
    return result


def faiss_rows(index) -> Callable[[np.ndarray], np.ndarray]:
    """Stored vectors of a FAISS index's rows (what :func:`verify_sample` compares)."""
    return lambda rows: np.stack([index.reconstruct(int(r)) for r in rows])


def import_faiss(
    index_file: Path,
    corpus: Path,
    spec: EncoderSpec,
    target: Path,
    verify: bool = True,
    block_rows: int = 10_000,
    sample: int = VERIFY_SAMPLE,
    min_cosine: float = VERIFY_MIN_COSINE,
) -> Path:
    """Write the index directory ``target`` over ``index_file`` (row i = passage i of ``corpus``)."""
    index_file, corpus = Path(index_file), Path(corpus)
    for path in (index_file, corpus):
        if not path.is_file():
            raise FileNotFoundError(f"not found: {path}")
    index = read_faiss(index_file, mapped=True)
    settings, factory = imported_settings(index)
    dim = spec.dimension()
    if index.d != dim:
        raise IndexMismatchError(
            f"{index_file} has vectors of dimension {index.d}, the encoder {spec.name} gives {dim}"
        )
    start = time.perf_counter()
    blocks = plan_blocks(corpus, block_rows)
    n = sum(b.n_rows for b in blocks)
    if index.ntotal != n:
        raise IndexMismatchError(
            f"{index_file} has {index.ntotal} rows, {corpus} has {n} passages (non-blank lines): row i of the "
            "index must be line i of the corpus"
        )
    log.info("import: %d rows of dimension %d, corpus %s (%.1f s)", n, dim, corpus, time.perf_counter() - start)
    verification = (
        verify_sample(faiss_rows(index), corpus, blocks, spec, sample, min_cosine)
        if verify
        else {"verified": False, "skipped": True}
    )
    if verify:
        log.info(
            "import: %d sampled passages match their stored rows (cosine min %.5f, mean %.5f)",
            verification["sample_rows"],
            verification["cosine_min"],
            verification["cosine_mean"],
        )
    del index
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        merger = FrequencyMerger()
        progress = Progress("passages", n, label="import doc store", every_s=10.0, log=log)

        def tables():
            for block in blocks:
                docs, df = read_block(corpus, block)
                merger.add(df, block.n_rows)
                progress.advance(block.n_rows)
                yield docs

        write_doc_store(tables(), n, tmp)
        merger.write(tmp)
        link_or_copy(index_file, tmp / FAISS_FILE)
        manifest = {
            **expected_manifest(spec, settings, corpus, file_sha256(corpus)),
            "count": n,
            "factory": factory,
            "n_docs": n,
            "docstore": "docs.arrow",
            "tokenisation": TOKENISATION,
            "import": {
                "source": str(index_file.resolve()),
                "source_bytes": index_file.stat().st_size,
                "source_sha256": file_sha256(index_file),
                **verification,
            },
        }
        finish_index_dir(tmp, target, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows it (no second 64 GB copy), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
