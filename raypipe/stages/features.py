"""Ray adapter of the trajectory signals: batches of whole trajectories in, their feature rows out.

Two steps, so that a trajectory never straddles two calls however the input files were split:
``groupby("qid").map_groups(pack_trajectory)`` (cheap tasks) turns each trajectory's iteration rows into
one row, then ``map_batches(FeatureStage)`` on an actor pool (each actor holding the sentence encoder,
:mod:`raypipe.features.resources`) computes a batch of trajectories with one encoder call per kind
(:func:`raypipe.features.extract.extract_many`, the pure core). Document vectors, document frequencies,
query vectors and the question's own list come from the retrieval service in batched calls
(:class:`raypipe.runtime.corpus_service.ServiceCorpus`): no features actor loads an index. The service is
``retrieval.backend``'s: replicas started for the job over the run's index (``actors``), or the
``raypipe serve-retrieval`` deployment by name (``serve``) or by URL (``http``); a plain Search-R1
server cannot give vectors or frequencies, and the stage then stops at start saying so.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq

from raypipe.analysis.headlines import features_headline
from raypipe.core.config import ConfigError, FeaturesConfig, RunConfig
from raypipe.core.progress import Progress
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.core.schema import FEATURES, ITERATIONS, conform
from raypipe.features.correlation import correlation_table, format_table, write_csv
from raypipe.features.extract import extract_many, idf_lookup
from raypipe.features.resources import CorpusResources, SbertEncoder, SentenceEncoder
from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.types import ReplicaService, SharedRetrievalService
from raypipe.runtime.batch_stage import BatchStage, BatchUDF
from raypipe.runtime.cluster import rerun_on_node_loss, route_ray_data_logs
from raypipe.runtime.corpus_service import ServiceCorpus
from raypipe.runtime.retrieval import corpus_transport, open_retrieval
from raypipe.runtime.stage_main import RunDirStage, StageRun

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = (
    "qid",
    "dataset",
    "iteration",
    "query",
    "doc_ids",
    "doc_scores",
    "reasoning",
    "probe_token_logprobs",
    "probe_f1",
    "utility",
)
LOG_EVERY_S = 30.0
ROWS_PER_PARTITION = 5000
MAX_PARTITIONS = 200
PACKED_ROWS = pa.list_(pa.struct([ITERATIONS.field(c) for c in REQUIRED_COLUMNS]))


def pack_trajectory(group: pa.Table) -> pa.Table:
    """``map_groups`` function: one trajectory's iteration rows -> one row ``(qid, rows)``."""
    rows = group.select(list(REQUIRED_COLUMNS)).to_pylist()
    return pa.table({"qid": [rows[0]["qid"]], "rows": pa.array([rows], type=PACKED_ROWS)})


class FeatureStage(BatchUDF):
    """Ray Data UDF (actor pool): a batch of packed trajectories (column ``rows``) -> their FEATURES rows."""

    stage_name = "features stage"
    input_columns = ("rows",)

    def __init__(
        self,
        questions: Mapping[str, str],
        corpus_factory: Callable[[], CorpusResources],
        sentence_factory: Callable[[], SentenceEncoder],
        settings: FeaturesConfig | None = None,
    ):
        self.questions = questions
        self.corpus = corpus_factory()
        self.sentences = sentence_factory()
        self.settings = settings
        self.rows = 0
        self.progress = Progress("trajectories", label="features actor", every_s=LOG_EVERY_S, per=None, log=log)

    def process(self, batch: pa.Table) -> pa.Table:
        trajectories = batch.column("rows").to_pylist()
        if isinstance(self.corpus, ServiceCorpus):  # a remote corpus: one call for the batch's terms
            settings = self.settings or FeaturesConfig()
            by_lexicon: dict[str, list[str]] = {}
            for query in dict.fromkeys(row["query"] or "" for rows in trajectories for row in rows):
                terms, lexicon = idf_lookup(query, self.corpus, settings)  # what the extractor will look up
                by_lexicon.setdefault(lexicon, []).extend(terms)
            for lexicon, terms in by_lexicon.items():
                self.corpus.prefetch_terms(terms, lexicon)
        pairs = [(rows, self.questions.get(rows[0]["qid"])) for rows in trajectories]
        out = [row for rows in extract_many(pairs, self.corpus, self.sentences, self.settings) for row in rows]
        self.rows += len(out)
        self.progress.advance(len(trajectories), f"{self.rows} rows, {self.progress.rate(self.rows):.1f} rows/s")
        return conform(out, "features")


def run_features(
    run: RunDir,
    config: RunConfig,
    corpus_factory: Callable[[], CorpusResources] | None = None,
    sentence_factory: Callable[[], SentenceEncoder] | None = None,
) -> int:
    """Compute RUN_DIR/features/ from RUN_DIR/iterations/ (replacing an earlier features table); returns rows.

    ``corpus_factory`` defaults to ``retrieval.backend``'s service (:func:`open_corpus_service`),
    ``sentence_factory`` to the configured sentence model; tests pass fakes. Needs a running Ray.
    """
    service = None
    if corpus_factory is None:
        service, corpus_factory = open_corpus_service(config)
    try:
        return _run_features(run, config, corpus_factory, sentence_factory)
    finally:
        if service is not None:
            service.shutdown()


def open_corpus_service(
    config: RunConfig,
) -> tuple[ReplicaService | SharedRetrievalService, Callable[[], ServiceCorpus]]:
    """The retrieval service for ``retrieval.backend`` (replicas started here over the run's existing
    index, or the shared deployment by name or URL) and a factory of :class:`ServiceCorpus` over it.

    The service is asked for its corpus here, in the driver, so that one without the corpus calls (a
    plain Search-R1 server) or without the lexicon the IDF needs stops the stage before any actor
    starts, with the reason and what to do.
    """
    service = open_retrieval(config, build=False)
    try:
        transport = corpus_transport(service)
        corpus = ServiceCorpus(transport)
        corpus.prefetch_terms(["the"], idf_lookup("the", corpus, config.features)[1])  # the IDF's lexicon is there
        if isinstance(service, SharedRetrievalService):  # a deployment: where, and what it reports
            where = service.describe()
        else:
            where = {"backend": "actors", "index": service.index_path}
        log.info("features: retrieval service %s; corpus %s", where, corpus.info)
    except BaseException:
        service.shutdown()
        raise
    return service, partial(ServiceCorpus, transport)


def _run_features(
    run: RunDir,
    config: RunConfig,
    corpus_factory: Callable[[], CorpusResources],
    sentence_factory: Callable[[], SentenceEncoder] | None,
) -> int:
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
        n_rows,
        len(questions),
        partitions,
        cfg.actors,
    )
    stage = BatchStage(
        FeatureStage,
        {
            "questions": questions,
            "corpus_factory": corpus_factory,
            "sentence_factory": sentence_factory or partial(SbertEncoder, cfg.sentence_model),
            "settings": cfg,
        },
        actors=cfg.actors,
        batch_size=cfg.batch_trajectories,
        num_cpus=cfg.actor_num_cpus,
    )
    target = run.table_dir("features")
    tmp = run.path / ".features.tmp"

    def write() -> None:  # the whole pipeline into tmp: what a lost node makes run again
        if tmp.exists():
            shutil.rmtree(tmp)
        ds = ray.data.read_parquet(parts, columns=list(REQUIRED_COLUMNS))
        # Ray's default shuffle makes 200 partitions: far too many aggregators for a small run.
        packed = ds.groupby("qid", num_partitions=partitions).map_groups(
            pack_trajectory, batch_format="pyarrow", num_cpus=cfg.actor_num_cpus
        )
        stage.apply(packed).write_parquet(str(tmp))

    started = time.monotonic()
    rerun_on_node_loss(write, "features")
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
signal extractor on a Ray Data actor pool (each actor holds the sentence encoder; the index's vectors,
statistics and searches come from the retrieval service of retrieval.backend: replicas started for the
job over the run's index (actors), or a running `raypipe serve-retrieval` deployment by name (serve) or
URL (http; a plain Search-R1 server lacks the vectors and statistics and is refused)). Writes
RUN_DIR/features/ (one row per qid x iteration; columns: raypipe.core.schema.FEATURES), then prints each signal's Pearson r with P_i and U_i and saves that table as RUN_DIR/feature_correlations.csv.
The run's own config.yaml is the base configuration (its retrieval index) unless --config names another.
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`


def _features(stage: StageRun) -> int:
    route_ray_data_logs(stage.run.path / "logs")
    return run_features(stage.run, stage.config)


STAGE = RunDirStage(
    name="features",
    description=DESCRIPTION,
    run_dir_help="a run directory written by jobs/probe.py",
    log_to_driver=True,
    errors=(RunDirError, RetrievalServerError, ConfigError),
    headline=features_headline,  # what tracking.mlflow_uri logs
)


def main() -> None:
    stage, rows = STAGE.main(_features)
    run = stage.run
    table = correlation_table(run.read("features"))
    path = write_csv(table, run.path / "feature_correlations.csv")
    print(f"\n{rows} feature rows -> {run.table_dir('features')}\n")
    print(format_table(table))
    print(f"\n(saved to {path})")
