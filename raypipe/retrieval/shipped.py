"""Passage vectors shipped with the package for the bundled corpus, so a first run need not encode it.

Encoding the bundled corpus's 13,844 passages would be most of a fresh machine's first ``make run``.
``raypipe/data/mhqa/vectors/`` holds, per encoder build, the index job's own vectors of that corpus:
``<encoder>-<quantization>.npy`` (e.g. ``minilm-fp32.npy``; float16, row i = line i of ``corpus.jsonl``)
and its ``.json`` (what they were made from: the corpus's sha256, the encoder's name, prefixes and token
limit, the ``.npy``'s sha256, the command and that build's timings).

A build of the bundled corpus with a matching encoder (``retrieval.encode.shipped_vectors``, on by default)
checks the file before taking every block's vectors from it:

1. the ``.npy``'s sha256 equals the one its ``.json`` records (a changed file is not used);
2. every row is a unit vector within ``MAX_DISTANCE`` (the encoder normalises its vectors: a zeroed,
   scaled or truncated row fails);
3. a random sample of passages, re-encoded, matches their shipped rows within ``MAX_DISTANCE``: the
   float16 rounding of a unit vector (at most ``FLOAT16_ROUNDING``) plus the spread of the fp32 encoder
   between instruction sets (``ISA_SPREAD``, measured: AVX2 against AVX-512, docs/retrieval.md);
4. what matters for a run: for a random sample of bundled questions, the top-k passages searched in the
   shipped vectors are those a fresh encoding ranks first, in the same order (passages whose fresh scores
   differ by less than the tolerance may swap: their order is below the file's precision). The candidates
   come from the file (its top k and those close behind) and from a fresh encoding: each question's own
   context paragraphs (the dataset's supporting and distractor passages; among them are the passage ranked
   first for 90% of the bundled questions and 67% of all top-3 passages), re-encoded and ranked by their
   fresh vectors, so a damaged row of a passage that should rank first is re-encoded and seen, not just
   missing from the file's ranking.

The samples of checks 3 and 4 differ on every build (a fresh seed, recorded with the figures and logged),
so repeated builds check different rows. A file that fails is logged and the corpus is encoded as usual.
The index's manifest records which happened (``vectors``: ``shipped-float16`` or ``encoded``;
``build.vectors``: the checks' figures and ``seed``).

The file is reproducible: ``raypipe index --set retrieval.encode.shipped_vectors=false --force --export-vectors
DIR`` encodes the corpus and writes that index's vectors in this format; rounded to float16 they equal the
shipped file byte for byte on the machine that made it, and to float32 precision on any x86-64 CPU.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raypipe.data.loaders import BUNDLED_DATASETS, BUNDLED_DIR, Question, iter_corpus, load_datasets
from raypipe.retrieval.build import Block, EncodedBlock, encode_docs, read_block
from raypipe.retrieval.encoders import Encoder, EncoderSpec
from raypipe.retrieval.import_faiss import ImportVerificationError, cosines, verify_sample
from raypipe.retrieval.index import IndexMismatchError, file_sha256, load_index_dir
from raypipe.retrieval.store import passages_table

log = logging.getLogger(__name__)
SHIPPED_DIR = BUNDLED_DIR / "vectors"
SHIPPED_VERIFY_SAMPLE = 32  # random passages re-encoded
SHIPPED_VERIFY_QUESTIONS = 12  # bundled questions whose top-k is compared
SHIPPED_VERIFY_TOPK = 10
SHIPPED_READ_TOPK = 3  # the passages the agents read by default: their top 3 are counted apart
FORMAT = "raypipe shipped vectors v2"  # v2: the .npy's sha256 is recorded and checked
# ||float16(v) - v|| for a unit vector v: at most half a float16 ulp (2^-11 relative) per component, plus
# the absolute error of components small enough to be subnormal (2^-25 each, 384 of them at most)
FLOAT16_ROUNDING = 2.0**-11 + 384**0.5 * 2.0**-25
# The largest distance between fp32 MiniLM vectors of one text encoded with AVX-512 and with AVX2 kernels,
# with a margin of 20x (benchmarks/encoder_spread.py, AMD EPYC with AVX-512: ONNX Runtime under an emulated
# AVX2 EPYC 5.3e-7, torch held to AVX2 9.4e-7, both against ONNX Runtime on AVX-512)
ISA_SPREAD = 2e-5
MAX_DISTANCE = FLOAT16_ROUNDING + ISA_SPREAD
MIN_COSINE = 1 - MAX_DISTANCE**2 / 2  # unit vectors: ||a - b||^2 = 2 - 2 cos


def encoder_identity(spec: EncoderSpec) -> dict[str, Any]:
    """What must agree between the shipped vectors and a build for the build to use them."""
    _, passage_prefix = spec.prompts()
    return {
        "encoder": spec.name,
        "passage_prefix": passage_prefix,
        "max_length": spec.max_length,
        "dimension": spec.dimension(),
    }


def shipped_name(spec: EncoderSpec) -> str:
    """The file stem of an encoder build's shipped vectors: the encoder and its quantization."""
    return spec.name if spec.resolved_quantization == "int8" else f"{spec.name}-fp32"


def sample_questions(size: int, seed: int) -> list[Question]:
    """A random sample of the bundled questions (all datasets): the queries the ranking check uses."""
    questions = load_datasets(list(BUNDLED_DATASETS))
    return [questions[i] for i in np.sort(np.random.default_rng(seed).choice(len(questions), size, replace=False))]


def check_norms(vectors: np.ndarray) -> dict[str, Any]:
    """Every row a unit vector within ``MAX_DISTANCE`` (float16 rounding moves a norm by at most
    ``FLOAT16_ROUNDING``); :class:`ImportVerificationError` naming the rows that are not."""
    norms = np.linalg.norm(np.asarray(vectors, dtype=np.float64), axis=1)
    off = np.flatnonzero(np.abs(norms - 1) > MAX_DISTANCE)
    if len(off):
        shown = ", ".join(f"row {int(r)}: {norms[r]:.6f}" for r in off[:5])
        raise ImportVerificationError(
            f"{len(off)} of {len(norms)} rows are not unit vectors (norm 1 +- {MAX_DISTANCE:.1e}): "
            f"{shown}{' ...' if len(off) > 5 else ''}"
        )
    return {"norm_rows": len(norms), "norm_deviation_max": float(f"{np.abs(norms - 1).max():.3g}")}


def same_ranking(shipped_top: np.ndarray, fresh_top: np.ndarray, fresh_scores: dict[int, float], tie: float) -> bool:
    """Whether the shipped top-k is the fresh top-k: the same passages in the same order, except passages
    whose fresh scores are within ``tie`` of each other (position by position, the fresh scores of the two
    lists may differ by ``tie`` at most)."""
    return all(abs(fresh_scores[int(a)] - fresh_scores[int(b)]) <= tie for a, b in zip(shipped_top, fresh_top))


@dataclass(frozen=True)
class ShippedVectors:
    """One encoder's shipped vectors of one corpus (memory-mapped)."""

    path: Path  # the .npy file
    meta: dict[str, Any]  # its .json

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of corpus rows (ascending)."""
        return np.asarray(np.load(self.path, mmap_mode="r")[rows], dtype=np.float32)

    def verify(
        self,
        corpus: Path,
        blocks: list[Block],
        spec: EncoderSpec,
        size: int = SHIPPED_VERIFY_SAMPLE,
        questions: int = SHIPPED_VERIFY_QUESTIONS,
        k: int = SHIPPED_VERIFY_TOPK,
        seed: int | None = None,
    ) -> dict[str, Any] | None:
        """Check every row's norm, re-encode a random sample of passages and the passages a sample of
        questions ranks first (in the file or freshly), and compare them with the shipped rows: the checks'
        result, or None (logged) when they do not match. ``seed`` (default: a fresh one, recorded in the
        result) draws both samples."""
        seed = secrets.randbits(32) if seed is None else seed
        log.info("checking the shipped vectors %s (sample seed %d)", self.path.name, seed)
        try:
            stored = np.asarray(np.load(self.path, mmap_mode="r"), dtype=np.float32)
            norms = check_norms(stored)
            encoder = spec.load()
            docs = passages_table(list(iter_corpus(corpus)))  # read once for both checks (no lexicon counts)
            check = verify_sample(
                self.rows, corpus, blocks, spec, size, MIN_COSINE, seed=seed, encoder=encoder, docs=docs
            )
            check.update(self.verify_rankings(docs, encoder, sample_questions(questions, seed), k, stored))
        except ImportVerificationError as exc:
            log.warning(
                "not using the shipped vectors %s (sample seed %d): %s; encoding the corpus instead",
                self.path.name,
                seed,
                exc,
            )
            return None
        return {"dtype": self.meta["dtype"], "sha256": self.meta["sha256"], **norms, **check}

    def verify_rankings(
        self, docs: pa.Table, encoder: Encoder, questions: list[Question], k: int, stored: np.ndarray
    ) -> dict[str, Any]:
        """Search ``questions`` in the shipped vectors ``stored`` (of the corpus ``docs``), re-encode every passage
        that could be in a top-k (the top k, those within twice ``MAX_DISTANCE`` of the k-th score: no other can
        overtake them if every vector is within ``MAX_DISTANCE``, which is checked on them too; and each question's own
        context paragraphs, whose rank comes from the fresh encoding alone) and require the fresh top-k to be the
        shipped one."""
        queries = [q.question for q in questions]
        k = min(k, len(stored))
        query_vectors = encoder.encode_queries(queries)
        scores = query_vectors @ stored.T
        order = np.argsort(-scores, axis=1, kind="stable")
        kth = scores[np.arange(len(queries)), order[:, k - 1]]
        row_of = {doc_id: row for row, doc_id in enumerate(docs.column("doc_id").to_pylist())}
        own = [
            np.asarray([row_of[p] for p in q.extra.get("paragraph_ids", ()) if p in row_of], dtype=np.int64)
            for q in questions
        ]
        candidates = [
            np.union1d(order[i][scores[i, order[i]] >= kth[i] - 2 * MAX_DISTANCE], own[i]) for i in range(len(queries))
        ]
        rows = np.unique(np.concatenate(candidates))
        fresh, _ = encode_docs(encoder, docs.take(rows), 64)
        found = cosines(stored[rows], fresh)
        if (found < MIN_COSINE).any():
            raise ImportVerificationError(
                f"{int((found < MIN_COSINE).sum())} of the {len(rows)} passages the sample questions rank first or "
                f"cite, re-encoded, do not match their shipped vectors (least cosine {found.min():.9f} < "
                f"{MIN_COSINE:.9f})"
            )
        fresh_of = dict(zip(rows.tolist(), range(len(rows))))
        identical, identical_read, differing = 0, 0, []
        for i, rows_i in enumerate(candidates):
            fresh_scores = {int(r): float(query_vectors[i] @ fresh[fresh_of[int(r)]]) for r in rows_i}
            fresh_top = sorted(rows_i.tolist(), key=lambda r: (-fresh_scores[r], r))[:k]
            shipped_top = order[i, :k]
            identical += bool(np.array_equal(shipped_top, fresh_top))
            identical_read += bool(np.array_equal(shipped_top[:SHIPPED_READ_TOPK], fresh_top[:SHIPPED_READ_TOPK]))
            if not same_ranking(shipped_top, np.asarray(fresh_top), fresh_scores, 2 * MAX_DISTANCE):
                differing.append(queries[i])
        if differing:
            raise ImportVerificationError(
                f"{len(differing)} of {len(queries)} sample questions rank other passages first in the shipped "
                f"vectors than in a fresh encoding (top {k}), e.g. {differing[0]!r}"
            )
        return {
            "rank_questions": len(queries),
            "rank_top_k": k,
            "rank_passages_encoded": len(rows),
            "rank_own_paragraphs": int(sum(len(o) for o in own)),
            "rank_identical": identical,
            f"rank_identical_top{SHIPPED_READ_TOPK}": identical_read,
            "rank_cosine_min": round(float(found.min()), 9),
        }

    def encode_blocks(self, spec: EncoderSpec, corpus: Path, blocks: list[Block]) -> Iterator[EncodedBlock]:
        """An ``EncodeBlocks`` that reads each block and takes its vectors from the file (no encoder)."""
        vectors = np.load(self.path, mmap_mode="r")
        for block in blocks:
            docs, df = read_block(corpus, block)
            rows = np.asarray(vectors[block.start : block.start + block.n_rows], dtype=np.float32)
            yield EncodedBlock(block, docs, df, rows, 0.0)


def find_shipped(spec: EncoderSpec, corpus_sha256: str, directory: Path | None = None) -> ShippedVectors | None:
    """The shipped vectors of this corpus (by sha256: the same lines, so the same row count) and encoder
    build, if any and if the file is the one its manifest describes (sha256, shape)."""
    directory = directory or SHIPPED_DIR
    meta_file = directory / f"{shipped_name(spec)}.json"
    if spec.is_hash or not meta_file.exists():
        return None
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT or meta.get("corpus_sha256") != corpus_sha256:
        return None
    wanted = encoder_identity(spec)
    differences = {k: (meta.get(k), v) for k, v in wanted.items() if meta.get(k) != v}
    if differences:
        log.info(
            "shipped vectors %s not used: made with %s",
            meta_file.name,
            ", ".join(f"{k}={old!r} (this build: {new!r})" for k, (old, new) in differences.items()),
        )
        return None
    path = meta_file.with_suffix(".npy")
    digest = file_sha256(path)
    if digest != meta.get("sha256"):
        log.warning(
            "not using the shipped vectors %s: its sha256 is %s, %s records %s (the file was changed after "
            "it was made; reinstalling raypipe restores it); encoding the corpus instead",
            path,
            digest,
            meta_file.name,
            meta.get("sha256"),
        )
        return None
    shape = np.load(path, mmap_mode="r").shape
    if shape != (meta.get("rows"), wanted["dimension"]):
        raise IndexMismatchError(
            f"{path} holds {shape[0]} x {shape[1]} vectors, its {meta_file.name} says "
            f"{meta.get('rows')} x {wanted['dimension']}"
        )
    return ShippedVectors(path, meta)


def export_vectors(index_dir: Path, spec: EncoderSpec, out_dir: Path, command: str) -> Path:
    """Write a flat index's vectors in the shipped format (``out_dir/<encoder>-<quantization>.npy`` and ``.json``)."""
    loaded = load_index_dir(index_dir, spec)
    manifest = loaded.manifest
    if manifest["index_type"] != "flat":
        raise IndexMismatchError(
            f"{index_dir} is a {manifest['index_type']} index: only a flat index holds its vectors exactly"
        )
    if manifest.get("build", {}).get("vectors", {}).get("source") == "shipped":
        log.warning("%s was built from shipped vectors: exporting it reproduces them, not an encoding", index_dir)
    index = loaded.faiss_index()
    vectors = index.reconstruct_n(0, index.ntotal).astype(np.float16)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{shipped_name(spec)}.npy"
    np.save(path, vectors)
    encoder_build = {key: manifest[key] for key in ("encoder_backend", "quantization", "int8_isa") if key in manifest}
    meta = {
        "format": FORMAT,
        "corpus_sha256": manifest["corpus_sha256"],
        "rows": int(vectors.shape[0]),
        "dtype": "float16",
        "sha256": file_sha256(path),
        **encoder_identity(spec),
        **encoder_build,
        "made_by": command,
        "index_built": manifest.get("created"),
        "index_build": manifest.get("build", {}),
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return path
