"""Passage vectors shipped with the package for the bundled corpus, so a first run need not encode it.

Encoding the bundled corpus's 13,844 passages is most of a fresh machine's first ``make run`` (about
4.5 minutes on 2 cores). ``raypipe/data/mhqa/vectors/`` holds, per encoder, the index job's own vectors
of that corpus: ``<encoder>.npy`` (float16, row i = line i of ``corpus.jsonl``) and ``<encoder>.json``
(what they were made from: the corpus's sha256, the encoder's name, prefixes and token limit, and the
command). A build of the bundled corpus with a matching encoder (``retrieval.shipped_vectors``, on by
default) first re-encodes a random sample of passages and requires each to match its shipped row
(cosine at least ``VERIFY_MIN_COSINE``), then takes every block's vectors from the file instead of
encoding it; a sample that does not match is logged and the corpus is encoded as usual. The index's
manifest records which happened.

The file is reproducible: ``raypipe index --set retrieval.shipped_vectors=false --force`` encodes the
corpus, and ``raypipe index --export-vectors DIR`` writes that index's vectors in this format; rounded to
float16 they equal the shipped file (on the machine that made it: int8 kernels may differ by CPU in the
last bits, which the cosine check allows). Float16 halves the file (10.6 MB for MiniLM's 384
dimensions); an index built from it differs from an encoded one by that rounding only (cosine > 0.9999).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raypipe.data.loaders import BUNDLED_DIR
from raypipe.retrieval.build import Block, EncodedBlock, read_block
from raypipe.retrieval.encoders import EncoderSpec
from raypipe.retrieval.import_faiss import VERIFY_MIN_COSINE, ImportVerificationError, verify_sample
from raypipe.retrieval.index import IndexMismatchError, load_index_dir

log = logging.getLogger(__name__)
SHIPPED_DIR = BUNDLED_DIR / "vectors"
SHIPPED_VERIFY_SAMPLE = 32
FORMAT = "raypipe shipped vectors v1"


def encoder_identity(spec: EncoderSpec) -> dict[str, Any]:
    """What must agree between the shipped vectors and a build for the build to use them."""
    _, passage_prefix = spec.prompts()
    return {"encoder": spec.name, "passage_prefix": passage_prefix, "max_length": spec.max_length,
            "dimension": spec.dimension()}


@dataclass(frozen=True)
class ShippedVectors:
    """One encoder's shipped vectors of one corpus (memory-mapped)."""

    path: Path  # the .npy file
    meta: dict[str, Any]  # its .json

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of corpus rows (ascending)."""
        return np.asarray(np.load(self.path, mmap_mode="r")[rows], dtype=np.float32)

    def verify(self, corpus: Path, blocks: list[Block], spec: EncoderSpec, size: int = SHIPPED_VERIFY_SAMPLE,
               min_cosine: float = VERIFY_MIN_COSINE) -> dict[str, Any] | None:
        """Re-encode a random sample and compare it with the shipped rows: the check's result, or None
        (logged) when they do not match."""
        try:
            return verify_sample(self.rows, corpus, blocks, spec, size, min_cosine)
        except ImportVerificationError as exc:
            log.warning("not using the shipped vectors %s: %s; encoding the corpus instead", self.path.name, exc)
            return None

    def encode_blocks(self, spec: EncoderSpec, corpus: Path, blocks: list[Block]) -> Iterator[EncodedBlock]:
        """An ``EncodeBlocks`` that reads each block and takes its vectors from the file (no encoder)."""
        vectors = np.load(self.path, mmap_mode="r")
        for block in blocks:
            docs, df = read_block(corpus, block)
            rows = np.asarray(vectors[block.start : block.start + block.n_rows], dtype=np.float32)
            yield EncodedBlock(block, docs, df, rows, 0.0)


def find_shipped(spec: EncoderSpec, corpus_sha256: str, directory: Path | None = None) -> ShippedVectors | None:
    """The shipped vectors of this corpus (by sha256: the same lines, so the same row count) and encoder, if any."""
    directory = directory or SHIPPED_DIR
    meta_file = directory / f"{spec.name}.json"
    if spec.is_hash or not meta_file.exists():
        return None
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT or meta.get("corpus_sha256") != corpus_sha256:
        return None
    wanted = encoder_identity(spec)
    differences = {k: (meta.get(k), v) for k, v in wanted.items() if meta.get(k) != v}
    if differences:
        log.info("shipped vectors %s not used: made with %s", meta_file.name,
                 ", ".join(f"{k}={old!r} (this build: {new!r})" for k, (old, new) in differences.items()))
        return None
    path = meta_file.with_suffix(".npy")
    shape = np.load(path, mmap_mode="r").shape
    if shape != (meta.get("rows"), wanted["dimension"]):
        raise IndexMismatchError(f"{path} holds {shape[0]} x {shape[1]} vectors, its {meta_file.name} says "
                                 f"{meta.get('rows')} x {wanted['dimension']}")
    return ShippedVectors(path, meta)


def export_vectors(index_dir: Path, spec: EncoderSpec, out_dir: Path, command: str) -> Path:
    """Write a flat index's vectors in the shipped format (``out_dir/<encoder>.npy`` and ``.json``)."""
    loaded = load_index_dir(index_dir, spec)
    manifest = loaded.manifest
    if manifest["index_type"] != "flat":
        raise IndexMismatchError(f"{index_dir} is a {manifest['index_type']} index: only a flat index holds its vectors exactly")
    if manifest.get("build", {}).get("vectors", {}).get("source") == "shipped":
        log.warning("%s was built from shipped vectors: exporting it reproduces them, not an encoding", index_dir)
    index = loaded.faiss_index()
    vectors = index.reconstruct_n(0, index.ntotal).astype(np.float16)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{spec.name}.npy"
    np.save(path, vectors)
    meta = {"format": FORMAT, "corpus_sha256": manifest["corpus_sha256"], "rows": int(vectors.shape[0]),
            "dtype": "float16", **encoder_identity(spec), "made_by": command,
            "index_built": manifest.get("created"), "index_build": manifest.get("build", {})}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return path
