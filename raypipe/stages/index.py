"""The index job: driver and entry point (``raypipe index``, ``python jobs/index.py``)."""

from __future__ import annotations

import logging
import time

from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.retrieval.build import ensure_index
from raypipe.retrieval.index import RetrievalIndexError, load_index_dir
from raypipe.runtime.cluster import init_ray

DESCRIPTION = """Build the retrieval index (encoder + FAISS + doc store + corpus statistics) for the configured corpus.

Encodes the corpus (data.corpus) with retrieval.encoder as a Ray Data map_batches over an actor pool
(retrieval.encode_actors, encode_num_cpus / encode_num_gpus), builds the FAISS index
(retrieval.index_type, fp16) and writes the index directory (retrieval.index_dir, or one in
$RAYPIPE_CACHE/indexes keyed by corpus hash, encoder and index type). Rebuilding an unchanged corpus
with the same settings does nothing; --force rebuilds. Prints the index directory and a summary.
"""


log = logging.getLogger(__name__)


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
