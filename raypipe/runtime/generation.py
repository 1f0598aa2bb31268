"""The body of a probe generation actor, without Ray: one engine, many trajectories in flight, a crash ledger.

:class:`TrajectoryGenerator` holds one engine (and so one prefix cache) and an asyncio loop in a
background thread on which up to ``generation.max_concurrent_trajectories`` trajectories run at once,
from every batch it is working on, so a batch's slow tail does not idle the engine. It records each
trajectory's start and finish in the crash ledger (:mod:`raypipe.runtime.crashes`): a question in flight
at ``generation.max_question_crashes`` engine deaths runs alone (it holds every trajectory slot), and one
that killed its engine even then is written with ``stop_reason`` ``engine_crash`` without running again.
When the engine dies, :meth:`TrajectoryGenerator.run` raises :class:`~raypipe.llm.base.EngineDiedError`
after charging the questions in flight; the Ray adapter (``raypipe/stages/probe.py``) then ends its actor.
It also tells the ledger when its engine starts and is ready, for the driver's progress line. Given a
``log_dir``, everything the actor's process prints (vLLM's and its engine process's logs, raypipe's
lines, C libraries) goes to ``log_dir/generation-<actor>.log`` instead of Ray's worker log.

The stage's batch format: input columns :data:`INPUT_COLUMNS` (:func:`question_items` makes the rows); output
one row per question (:data:`OUTPUT`: the trajectory row, its iteration rows and the engine's record),
which :func:`split_output` turns into the run directory's two tables and :func:`write_batch` writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pyarrow as pa

from raypipe.agents import TrajectoryOutput, build_loop, build_protocol
from raypipe.agents.hooks import StopController
from raypipe.agents.protocol import AgentProtocol
from raypipe.core.config import EngineConfig, RunConfig
from raypipe.core.loopthread import LoopThread
from raypipe.core.progress import Progress
from raypipe.core.rows import TrajectoryRow
from raypipe.core.rundir import RunDir
from raypipe.core.schema import ITERATIONS, STOP_ENGINE_CRASH, TRAJECTORIES
from raypipe.data.loaders import Question
from raypipe.llm.base import Engine, EngineDiedError
from raypipe.llm.factory import build_engine
from raypipe.retrieval.types import Retriever
from raypipe.runtime.cluster import current_actor_id, current_node_id, send_output_to
from raypipe.runtime.crashes import CrashLedger, CrashRecord, RemoteCrashLedger

log = logging.getLogger(__name__)

ACTOR_LINE_EVERY_S = 30.0  # seconds between a generation actor's progress lines
INPUT_COLUMNS = ("qid", "dataset", "question", "golden_answers")
OUTPUT = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("trajectory", pa.struct(list(TRAJECTORIES))),
        pa.field("iterations", pa.list_(pa.struct(list(ITERATIONS)))),
        pa.field("engine", pa.string()),  # JSON: what the run records about the engine that produced the row
    ]
)


class TrajectoryGenerator:
    """Runs the agent loop over questions, concurrently, on one engine (module docstring)."""

    def __init__(
        self,
        config: dict[str, Any] | RunConfig,
        retriever: Retriever,
        controller: StopController | None = None,
        engine_factory: Callable[[EngineConfig], Engine] | None = None,
        crash_ledger: CrashLedger | RemoteCrashLedger | None = None,
        log_dir: str | None = None,
    ):
        self.config = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
        self.crash_ledger = crash_ledger if crash_ledger is not None else CrashLedger()
        actor = current_actor_id()
        self.name = actor[:8] if actor else f"pid{os.getpid()}"  # a restarted actor keeps its Ray id (and log file)
        log_file = None if log_dir is None else os.path.join(log_dir, f"generation-{self.name}.log")
        redirected = log_file is None or send_output_to(log_file)
        if not logging.getLogger().handlers:  # a Ray worker: raypipe's lines in its log (or the driver's with -v)
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if not redirected:
            log.warning("cannot write %s: this actor's output stays in Ray's worker log", log_file)
        agent = self.config.agent
        self.protocol = build_protocol(agent)
        self._thread = LoopThread("raypipe-trajectories")
        self._thread.run(self.crash_ledger.engine_starting(self.name))
        started = time.perf_counter()
        engine = (engine_factory or build_engine)(self.config.engine)
        self.engine: Engine = self._thread.run(prepare_engine(engine, self.config, self.protocol))
        self.engine_start_s = time.perf_counter() - started
        self._thread.run(self.crash_ledger.engine_ready(self.name, self.engine_start_s))
        self.engine_info = json.dumps(
            {
                **self.engine.describe(),
                "actor_start_seconds": round(self.engine_start_s, 2),
                "node_id": current_node_id(),
                # the GPUs Ray gave this actor (None outside Ray or without GPUs): one engine per GPU shows here
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        )
        self.loop = build_loop(self.config, self.engine, retriever, self.protocol, controller)
        self._slots, self._alone_lock = self._thread.run(
            _make_slots(self.config.generation.max_concurrent_trajectories)
        )
        self._running: set[str] = set()  # qids whose trajectory is in flight
        self._engine_died: EngineDiedError | None = None  # once set, no trajectory starts on this engine
        # the tokens/s counts finished trajectories only: a floor of the engine's rate
        self._progress = Progress("trajectories finished", label="actor", every_s=ACTOR_LINE_EVERY_S, per=None, log=log)
        self._in_flight = self._tokens = 0
        log.info(
            "generation actor ready in %.1f s (%s, %s)", self.engine_start_s, self.protocol.name, agent.enforcement
        )

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
            log.warning(
                "%s: written as %s after %d engine deaths: %s",
                question.qid,
                STOP_ENGINE_CRASH,
                record.crashes,
                record.error,
            )
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
                output = await self.loop.run(question, lambda row: self.crash_ledger.turn_done(question.qid))
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
        """Hold every trajectory slot: nothing else is in flight on the engine meanwhile."""
        slots = self.config.generation.max_concurrent_trajectories
        async with self._alone_lock:
            for _ in range(slots):
                await self._slots.acquire()
            try:
                yield
            finally:
                for _ in range(slots):
                    self._slots.release()

    def _finished(self, trajectory: TrajectoryRow) -> None:
        self._in_flight -= 1
        self._tokens += (trajectory.get("tokens_generated") or 0) + (trajectory.get("probe_tokens") or 0)
        rate = self._progress.rate(self._tokens)
        self._progress.advance(1, f"{self._in_flight} in flight, {rate:.0f} tokens/s in finished trajectories")

    def close(self) -> None:
        self._thread.run(self.engine.close())
        self._thread.stop()


async def prepare_engine(engine: Engine | Awaitable[Engine], config: RunConfig, protocol: AgentProtocol) -> Engine:
    """A built engine (awaited when its factory is async), checked against the agent's enforcement and warmed
    up: the enforcement grammars compile before real requests (vLLM gives up on one after a timeout)."""
    if inspect.isawaitable(engine):
        engine = await engine
    agent = config.agent
    if agent.enforcement != "none" and not engine.supports_regex:
        raise ValueError(
            f"agent.enforcement={agent.enforcement} needs structured outputs, which the "
            f"{config.engine.backend} backend does not offer; use engine.backend=vllm or agent.enforcement=none"
        )
    await engine.warmup(protocol.enforcement_regexes(agent))
    return engine


def crashed_output(question: Question, record: CrashRecord) -> TrajectoryOutput:
    """The row of a question that killed its engine even when running alone; no iteration rows (they
    died with the engine), so its rerun costs nothing more."""
    cause = record.error or "the generation actor's process died"
    trajectory: TrajectoryRow = {
        "qid": question.qid,
        "dataset": question.dataset,
        "question": question.question,
        "golden_answers": list(question.golden_answers),
        "final_answer": None,
        "final_f1": 0.0,
        "n_iterations": 0,
        "stop_reason": STOP_ENGINE_CRASH,
        "error": f"in flight at {record.crashes} engine or actor deaths, the last one alone; last error: {cause}",
        "tokens_generated": 0,
        "probe_tokens": 0,
        "wall_s": None,
        "transcript": "",
        # its costs died with the engine
        "prompt_tokens": None,
        "cached_tokens": None,
        "prefilled_tokens": None,
        "probe_prompt_tokens": None,
        "probe_cached_tokens": None,
        "retrieval_s": None,
        "queue_s": None,
        "engine_s": None,
        "searches_dropped": None,
    }
    return TrajectoryOutput(trajectory, [])


async def _make_slots(n: int) -> tuple[asyncio.Semaphore, asyncio.Lock]:
    """The trajectory slots, and the lock a question running alone takes while it gathers them all."""
    return asyncio.Semaphore(n), asyncio.Lock()


# ---------------------------------------------------------------- the stage's batch format


def question_items(questions: list[Question]) -> list[dict[str, Any]]:
    """Rows of the stage's input dataset."""
    return [
        {"qid": q.qid, "dataset": q.dataset, "question": q.question, "golden_answers": list(q.golden_answers)}
        for q in questions
    ]


def batch_questions(batch: pa.Table) -> list[Question]:
    """The questions of an input batch (columns :data:`INPUT_COLUMNS`)."""
    return [
        Question(
            qid=str(r["qid"]), dataset=r["dataset"], question=r["question"], golden_answers=list(r["golden_answers"])
        )
        for r in batch.select(list(INPUT_COLUMNS)).to_pylist()
    ]


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


def write_batch(run_dir: RunDir, batch: pa.Table, part: str) -> int:
    """Write an output batch as part ``part`` of both tables (iterations first: a trajectories part means the
    batch is complete); returns its trajectories."""
    trajectories, iterations = split_output(batch)
    run_dir.write_part("iterations", iterations, part)
    run_dir.write_part("trajectories", trajectories, part)
    return trajectories.num_rows
