"""The index job: build or reuse the index directory (:func:`raypipe.runtime.index_build.ensure_index`), or import
an existing FAISS index, then print a summary (``raypipe index``, ``python jobs/index.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.retrieval.build import encoder_spec
from raypipe.retrieval.import_faiss import VERIFY_MIN_COSINE, VERIFY_SAMPLE, import_faiss
from raypipe.retrieval.index import RetrievalIndexError, load_index_dir
from raypipe.retrieval.shipped import export_vectors
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.index_build import ensure_index
from raypipe.runtime.retrieval import check_index_folder
from raypipe.runtime.shared_storage import SharedStorageError

DESCRIPTION = """Build the retrieval index (encoder + FAISS + doc store + corpus statistics) for the configured corpus.

Reads the corpus (data.corpus) in blocks of retrieval.encode.block_rows passages, encodes them with
retrieval.encoder on a Ray Data actor pool (retrieval.encode.actors, num_cpus / num_gpus),
writes each block as it is done (a rerun after an interruption encodes only the missing blocks), then
builds the FAISS index (retrieval.index.type, fp16) and writes the index directory (retrieval.index.dir,
or one in $RAYPIPE_CACHE/indexes keyed by corpus hash, encoder and index type). Rebuilding an unchanged
corpus with the same settings does nothing; --force rebuilds. Prints the index directory and a summary.

--import-faiss INDEX_FILE --corpus CORPUS.jsonl --encoder ENCODER --out INDEX_DIR turns an existing
FAISS index whose row i is line i of the corpus (e.g. Search-R1's e5_Flat.index over wiki-18.jsonl)
into an index directory without re-encoding, after checking a re-encoded sample (unless --no-verify).

The bundled corpus's vectors ship with the package (retrieval.encode.shipped_vectors): its build checks a
re-encoded sample against them and encodes nothing. --export-vectors DIR writes an index's vectors in
that format; `raypipe index --set retrieval.encode.shipped_vectors=false --force --export-vectors DIR`
reproduces the shipped file from an encoding.
"""


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("--force", action="store_true", help="rebuild even if an identical index exists")
    parser.add_argument(
        "--export-vectors",
        metavar="DIR",
        help="then write the (flat) index's vectors as DIR/<encoder>.npy (float16) and .json: the format of "
        "the vectors shipped for the bundled corpus (raypipe/data/mhqa/vectors/)",
    )
    imports = parser.add_argument_group("import an existing FAISS index (no re-encoding)")
    imports.add_argument(
        "--import-faiss", metavar="INDEX_FILE", help="a flat inner-product FAISS index; row i = line i of --corpus"
    )
    imports.add_argument("--corpus", metavar="CORPUS.jsonl", help="the corpus of the index (sets data.corpus)")
    imports.add_argument(
        "--encoder", metavar="ENCODER", help="the encoder that made its vectors (sets retrieval.encoder)"
    )
    imports.add_argument("--out", metavar="INDEX_DIR", help="the index directory to write (sets retrieval.index.dir)")
    imports.add_argument(
        "--no-verify", action="store_true", help="skip re-encoding a sample of passages to check the encoder"
    )
    imports.add_argument(
        "--verify-sample",
        type=int,
        default=VERIFY_SAMPLE,
        metavar="N",
        help=f"passages re-encoded (default {VERIFY_SAMPLE})",
    )
    imports.add_argument(
        "--verify-min-cosine",
        type=float,
        default=VERIFY_MIN_COSINE,
        metavar="C",
        help=f"least cosine between a stored row and its re-encoded passage (default {VERIFY_MIN_COSINE})",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    extra = [
        f"{key}={value}"
        for key, value in (
            ("data.corpus", args.corpus),
            ("retrieval.encoder", args.encoder),
            ("retrieval.index.dir", args.out),
        )
        if value
    ]
    config = config_from_args(args, extra)
    spec = encoder_spec(config.retrieval)
    start = time.perf_counter()
    if args.import_faiss:
        if not (args.corpus and args.encoder and args.out):
            parser.error("--import-faiss needs --corpus, --encoder and --out")
        try:
            path = import_faiss(
                Path(args.import_faiss),
                Path(args.corpus),
                spec,
                Path(args.out),
                verify=not args.no_verify,
                block_rows=config.retrieval.encode.block_rows,
                sample=args.verify_sample,
                min_cosine=args.verify_min_cosine,
            )
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
        check = (
            f"verified on {imported['sample_rows']} passages (cosine min {imported['cosine_min']})"
            if imported.get("verified")
            else "not verified (--no-verify)"
        )
        print(f"  {'imported':<10} {imported['source']} ({imported['source_bytes'] / 1e6:.1f} MB), {check}")
    vectors = manifest.get("build", {}).get("vectors", {})
    if vectors.get("source") == "shipped":
        print(
            f"  {'vectors':<10} shipped {vectors['file']}, verified on {vectors['sample_rows']} re-encoded passages "
            f"(cosine min {vectors['cosine_min']}; sample seed {vectors.get('seed', 0)})"
        )
    print(f"  {'size':<10} {size / 1e6:.1f} MB on disk")
    print(f"  {'elapsed':<10} {elapsed:.1f} s")
