"""The generation stage Ray Data's ``map_batches`` runs: one engine, the retrieval client, many trajectories.

Each actor holds one engine (and so one prefix cache) and an asyncio loop in a background thread on
which up to ``generation.max_concurrent_trajectories`` trajectories run at once, from every batch the
actor is working on (``generation.batches_per_actor``), so a batch's slow tail does not idle the engine.

Input batch columns: qid, dataset, question, golden_answers. Output: one row per question with the
trajectory row (struct of the TRAJECTORIES columns) and its iteration rows (list of ITERATIONS
structs); :func:`split_output` turns an output batch into the two tables.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from raypipe.agents import AgentLoop, TrajectoryOutput, build_protocol, loop_settings
from raypipe.agents.hooks import StopController
from raypipe.core.config import EngineConfig, RunConfig
from raypipe.core.loopthread import LoopThread
from raypipe.core.schema import ITERATIONS, TRAJECTORIES
from raypipe.data.loaders import Question
from raypipe.llm.base import Engine
from raypipe.retrieval.types import Retriever
from raypipe.runtime.cluster import current_node_id

log = logging.getLogger(__name__)

INPUT_COLUMNS = ("qid", "dataset", "question", "golden_answers")
OUTPUT = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("trajectory", pa.struct(list(TRAJECTORIES))),
        pa.field("iterations", pa.list_(pa.struct(list(ITERATIONS)))),
        pa.field("engine", pa.string()),  # JSON: what the run records about the engine that produced the row
    ]
)


def question_items(questions: list[Question]) -> list[dict[str, Any]]:
    """Rows of the stage's input dataset."""
    return [{"qid": q.qid, "dataset": q.dataset, "question": q.question, "golden_answers": list(q.golden_answers)} for q in questions]


def default_engine_factory(config: EngineConfig) -> Engine:
    from raypipe.llm.factory import build_engine

    return build_engine(config)


def _engine_info(engine: Engine) -> dict[str, Any]:
    try:
        from raypipe.llm.factory import engine_info
    except ImportError:  # the engine backends are not installed (fakes in tests)
        return {"backend": type(engine).__name__}
    return engine_info(engine)


class GenerateStage:
    """Callable class for ``map_batches``: runs the agent loop over a batch of questions."""

    def __init__(
        self,
        config: dict[str, Any] | RunConfig,
        retriever: Retriever,
        controller: StopController | None = None,
        engine_factory: Callable[[EngineConfig], Engine] | None = None,
    ):
        self.config = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
        if not logging.getLogger().handlers:  # a Ray worker: show raypipe's progress lines in the driver's log
            logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        agent = self.config.agent
        self.protocol = build_protocol(agent)
        self.settings = loop_settings(self.config, self.protocol)
        self._thread = LoopThread("raypipe-trajectories")
        started = time.perf_counter()
        engine = (engine_factory or default_engine_factory)(self.config.engine)
        self.engine: Engine = self._thread.run(engine) if inspect.isawaitable(engine) else engine
        if agent.enforcement != "none" and getattr(self.engine, "supports_regex", True) is False:
            raise ValueError(
                f"agent.enforcement={agent.enforcement} needs structured outputs, which the "
                f"{self.config.engine.backend} backend does not offer; use engine.backend=vllm or agent.enforcement=none"
            )
        warmup = getattr(self.engine, "warmup", None)
        if warmup is not None:  # compile the enforcement grammars before real requests (vLLM gives up after a timeout)
            self._thread.run(warmup(self.protocol.enforcement_regexes(agent.enforcement, self.settings.bounds)))
        self.engine_start_s = time.perf_counter() - started
        self.engine_info = json.dumps(
            {**_engine_info(self.engine), "actor_start_seconds": round(self.engine_start_s, 2), "node_id": current_node_id()}
        )
        self.loop = AgentLoop(self.engine, retriever, self.protocol, self.settings, controller)
        self._slots = self._thread.run(_make_semaphore(self.config.generation.max_concurrent_trajectories))
        self._meter = ActorMeter()
        log.info("generation actor ready in %.1f s (%s, %s)", self.engine_start_s, self.protocol.name, agent.enforcement)

    def __call__(self, batch: pa.Table) -> pa.Table:
        missing = [c for c in INPUT_COLUMNS if c not in batch.column_names]
        if missing:
            raise ValueError(f"generation stage input lacks columns {missing}")
        questions = [
            Question(qid=str(r["qid"]), dataset=r["dataset"], question=r["question"], golden_answers=list(r["golden_answers"]))
            for r in batch.select(list(INPUT_COLUMNS)).to_pylist()
        ]
        return to_table(self.run(questions), self.engine_info)

    def run(self, questions: list[Question]) -> list[TrajectoryOutput]:
        """Run the trajectories of ``questions`` concurrently (blocking; callable from any thread)."""
        return self._thread.run(self._run_all(questions))

    async def _run_all(self, questions: list[Question]) -> list[TrajectoryOutput]:
        async def one(question: Question) -> TrajectoryOutput:
            async with self._slots:
                self._meter.started()
                output = await self.loop.run(question)
                line = self._meter.finished(output.trajectory)
                if line:
                    log.info("%s", line)
                return output

        return list(await asyncio.gather(*(one(q) for q in questions)))

    def close(self) -> None:
        self._thread.run(self.engine.close())
        self._thread.stop()


class ActorMeter:
    """An actor's progress between output parts (every ``every_s``): trajectories finished and in flight, and the
    tokens of finished trajectories per second (a floor of the engine's rate: tokens in flight are not counted)."""

    def __init__(self, every_s: float = 30.0):
        self.every_s = every_s
        self.started_at = self.last_line = time.monotonic()
        self.in_flight = self.done = self.tokens = 0

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, trajectory: dict[str, Any]) -> str | None:
        """Count a finished trajectory; a progress line when ``every_s`` has passed since the last one."""
        self.in_flight -= 1
        self.done += 1
        self.tokens += (trajectory.get("tokens_generated") or 0) + (trajectory.get("probe_tokens") or 0)
        now = time.monotonic()
        if now - self.last_line < self.every_s:
            return None
        self.last_line = now
        rate = self.tokens / max(now - self.started_at, 1e-9)
        return f"actor: {self.done} trajectories finished, {self.in_flight} in flight, {rate:.0f} tokens/s in finished trajectories"


def to_table(outputs: list[TrajectoryOutput], engine_info: str = "{}") -> pa.Table:
    rows = [
        {"qid": o.trajectory["qid"], "trajectory": o.trajectory, "iterations": o.iterations, "engine": engine_info}
        for o in outputs
    ]
    return pa.Table.from_pylist(rows, schema=OUTPUT)


def split_output(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(trajectories, iterations) tables of the run directory from a stage output batch."""
    trajectories = pa.Table.from_struct_array(table.column("trajectory").combine_chunks()).cast(TRAJECTORIES)
    nested = table.column("iterations").combine_chunks()
    iterations = pa.Table.from_struct_array(nested.flatten()).cast(ITERATIONS)
    return trajectories, iterations


async def _make_semaphore(n: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(n)
