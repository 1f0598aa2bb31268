"""Ray adapter of the trajectory signals: batches of whole trajectories in, their feature rows out.

Two steps, so that a trajectory never straddles two calls however the input files were split:
``groupby("qid").map_groups(pack_trajectory)`` (cheap tasks) turns each trajectory's iteration rows into
one row, then ``map_batches(FeatureStage)`` on an actor pool (each actor holding the sentence encoder
and the retrieval index, see :class:`IndexCorpus`) computes a batch of trajectories with one encoder
call per kind (:func:`raypipe.features.extract.extract_many`, the pure core).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypipe.core.config import FeaturesConfig, RunConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.core.schema import FEATURES, ITERATIONS, conform
from raypipe.features.correlation import correlation_table, format_table, write_csv
from raypipe.features.extract import SignalSettings, extract_many
from raypipe.features.resources import CorpusResources, SentenceEncoder
from raypipe.runtime.cluster import init_ray

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = (
    "qid", "dataset", "iteration", "query", "doc_ids", "doc_scores", "reasoning",
    "probe_token_logprobs", "probe_f1", "utility",
)  # fmt: skip
LOG_EVERY_S = 30.0
ROWS_PER_PARTITION = 5000
MAX_PARTITIONS = 200


def signal_settings(cfg: FeaturesConfig) -> SignalSettings:
    return SignalSettings(
        rbo_p=cfg.rbo_p,
        nqc_depth=cfg.nqc_depth,
        nqc_k=cfg.nqc_k,
        a_pair_depth=cfg.a_pair_depth,
        dense_qpp_k=cfg.dense_qpp_k,
        confidence_drop_last=cfg.confidence_drop_last,
    )


class SbertEncoder:
    """A sentence-transformers model (embedded name or folder) as a :class:`SentenceEncoder`."""

    def __init__(self, ref: str = "minilm", batch_size: int = 64):
        from sentence_transformers import SentenceTransformer

        from raypipe.core.models import resolve_sentence_model

        self.model = SentenceTransformer(str(resolve_sentence_model(ref)), device="cpu", local_files_only=True)
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)


class IndexCorpus:
    """:class:`CorpusResources` over a retrieval index directory (``raypipe.retrieval``).

    Document vectors are read back from the FAISS index (``reconstruct``: exact for flat indexes,
    approximate for PQ); an index that cannot reconstruct (e.g. on GPU) re-encodes the passages with the
    index's own encoder instead. IDF uses the index's corpus statistics and their tokeniser.
    """

    def __init__(self, retriever: Any):
        from raypipe.retrieval.store import tokenize

        self.retriever = retriever
        self.stats = retriever.index_dir.stats
        self.num_docs = int(self.stats.n_docs)
        self._tokenize = tokenize
        self._reconstruct = _direct_map(retriever.index)

    @classmethod
    def open(cls, config: RunConfig) -> "IndexCorpus":
        from raypipe.retrieval.build import encoder_spec, index_dir_for, search_params
        from raypipe.retrieval.searcher import LocalRetriever

        path = index_dir_for(config)
        log.info("features: index %s", path)
        return cls(LocalRetriever.open(path, encoder_spec(config.retrieval), search_params(config.retrieval)))

    def terms(self, text: str) -> list[str]:
        return self._tokenize(text)

    def document_frequency(self, term: str) -> int:
        return self.stats.df(term)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        docs = self.retriever.docs
        rows = [docs.row_of(d) for d in doc_ids]
        if self._reconstruct:
            return np.stack([self.retriever.index.reconstruct(r) for r in rows]).astype(np.float32)
        from raypipe.retrieval.encoders import passage_text

        return self.retriever.encoder.encode_passages([passage_text(p.title, p.text) for p in docs.get(rows)])

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.retriever.encoder.encode_queries(list(texts))

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        return [[hit.doc_id for hit in result.hits] for result in self.retriever.search_batch(texts, k)]


def _direct_map(index: Any) -> bool:
    """Prepare ``index`` for ``reconstruct``; False when it cannot reconstruct."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    try:
        if ivf is not None:
            ivf.make_direct_map()
        if index.ntotal:
            index.reconstruct(0)
    except RuntimeError:
        log.info("features: the index cannot reconstruct vectors; re-encoding passages instead")
        return False
    return True


PACKED_ROWS = pa.list_(pa.struct([ITERATIONS.field(c) for c in REQUIRED_COLUMNS]))


def pack_trajectory(group: pa.Table) -> pa.Table:
    """``map_groups`` function: one trajectory's iteration rows -> one row ``(qid, rows)``."""
    rows = group.select(list(REQUIRED_COLUMNS)).to_pylist()
    return pa.table({"qid": [rows[0]["qid"]], "rows": pa.array([rows], type=PACKED_ROWS)})


class FeatureStage:
    """Callable class for ``map_batches``: a batch of packed trajectories -> their FEATURES rows."""

    def __init__(
        self,
        questions: Mapping[str, str],
        corpus_factory: Callable[[], CorpusResources],
        sentence_factory: Callable[[], SentenceEncoder],
        settings: SignalSettings = SignalSettings(),
    ):
        self.questions = questions
        self.corpus = corpus_factory()
        self.sentences = sentence_factory()
        self.settings = settings
        self.trajectories = self.rows = 0
        self.started = self.logged = time.monotonic()

    def __call__(self, batch: pa.Table) -> pa.Table:
        trajectories = batch.column("rows").to_pylist()
        pairs = [(rows, self.questions.get(rows[0]["qid"])) for rows in trajectories]
        out = [row for rows in extract_many(pairs, self.corpus, self.sentences, self.settings) for row in rows]
        self._progress(len(trajectories), len(out))
        return conform(out, "features")

    def _progress(self, trajectories: int, rows: int) -> None:
        self.trajectories += trajectories
        self.rows += rows
        now = time.monotonic()
        if now - self.logged >= LOG_EVERY_S:
            self.logged = now
            rate = self.rows / max(now - self.started, 1e-9)
            log.info("features actor: %d trajectories, %d rows, %.1f rows/s", self.trajectories, self.rows, rate)


def run_features(
    run: RunDir,
    config: RunConfig,
    corpus_factory: Callable[[], CorpusResources] | None = None,
    sentence_factory: Callable[[], SentenceEncoder] | None = None,
) -> int:
    """Compute RUN_DIR/features/ from RUN_DIR/iterations/ (replacing an earlier features table); returns rows.

    ``corpus_factory`` / ``sentence_factory`` default to the run's retrieval index and the configured
    sentence model; tests pass fakes. Needs a running Ray.
    """
    import ray

    cfg = config.features
    questions = _questions(run)
    parts = sorted(str(p) for p in run.table_dir("iterations").glob("*.parquet"))
    if not parts:
        run.read("iterations")  # raises the error that names the producing stage
    missing = [c for c in REQUIRED_COLUMNS if c not in pq.read_schema(parts[0]).names]
    if missing:
        raise ValueError(f"{parts[0]}: iterations table lacks columns {missing}")
    n_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    partitions = cfg.partitions or max(cfg.actors, min(-(-n_rows // ROWS_PER_PARTITION), MAX_PARTITIONS))
    log.info(
        "features: %d iteration rows, %d questions, %d partitions, %d actors",
        n_rows, len(questions), partitions, cfg.actors,
    )  # fmt: skip
    ds = ray.data.read_parquet(parts, columns=list(REQUIRED_COLUMNS))
    # Ray's default shuffle makes 200 partitions: far too many aggregators for a small run.
    packed = ds.groupby("qid", num_partitions=partitions).map_groups(
        pack_trajectory, batch_format="pyarrow", num_cpus=cfg.actor_num_cpus
    )
    features = packed.map_batches(
        FeatureStage,
        batch_size=cfg.batch_trajectories,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=cfg.actors),
        num_cpus=cfg.actor_num_cpus,
        fn_constructor_kwargs={
            "questions": questions,
            "corpus_factory": corpus_factory or partial(IndexCorpus.open, config),
            "sentence_factory": sentence_factory or partial(SbertEncoder, cfg.sentence_model),
            "settings": signal_settings(cfg),
        },
    )
    target = run.table_dir("features")
    tmp = run.path / ".features.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    started = time.monotonic()
    features.write_parquet(str(tmp))
    if not any(tmp.glob("*.parquet")):  # no trajectories: still leave an (empty) table behind
        tmp.mkdir(parents=True, exist_ok=True)
        pq.write_table(FEATURES.empty_table(), tmp / "empty.parquet")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in target.glob("*.parquet"))
    elapsed = time.monotonic() - started
    log.info("features: %d rows in %.1f s (%.1f rows/s) -> %s", rows, elapsed, rows / max(elapsed, 1e-9), target)
    return rows


def _questions(run: RunDir) -> dict[str, str]:
    table = run.read("trajectories", columns=["qid", "question"])
    return dict(zip(table.column("qid").to_pylist(), table.column("question").to_pylist()))


DESCRIPTION = """Trajectory signals (QPP, RBO, SBERT similarity, probe confidence) for a run: RUN_DIR/features/.

Reads RUN_DIR/iterations/ and RUN_DIR/trajectories/, groups the iterations by trajectory and runs the
signal extractor on a Ray Data actor pool (each actor holds the sentence encoder and the run's retrieval
index). Writes RUN_DIR/features/ (one row per qid x iteration; columns: raypipe.core.schema.FEATURES), then
prints each signal's Pearson r with P_i and U_i and saves that table as RUN_DIR/feature_correlations.csv.
The run's own config.yaml is the base configuration (its retrieval index) unless --config names another.
"""




def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by jobs/probe.py")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)

    import ray

    init_ray(config, log_to_driver=True)
    try:
        rows = run_features(run, config)
    except RunDirError as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    run.write_config(config, "features")

    table = correlation_table(run.read("features"))
    path = write_csv(table, run.path / "feature_correlations.csv")
    print(f"\n{rows} feature rows -> {run.table_dir('features')}\n")
    print(format_table(table))
    print(f"\n(saved to {path})")
