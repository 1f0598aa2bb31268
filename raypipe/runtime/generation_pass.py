"""The probe job's generation pass: the generation actors over the questions to run (Ray Data), each batch written
as a part of the run directory as it comes; the stage (:mod:`raypipe.stages.probe`) runs it again after a lost node."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from raypipe.agents.hooks import StopController
from raypipe.agents.probe_run import INFO_FILE, update_info
from raypipe.core.config import EngineConfig, RunConfig
from raypipe.core.retry import drop_retried
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import Question
from raypipe.llm.base import Engine
from raypipe.retrieval.types import Retriever
from raypipe.runtime.batch_stage import BatchStage
from raypipe.runtime.crashes import start_crash_ledger
from raypipe.runtime.generation import question_items, write_batch
from raypipe.runtime.generation_progress import GenerationReporter, engine_start_hint, show_actor_logs

log = logging.getLogger("raypipe.stages.probe")  # the job's own progress lines, under the stage's name


def generate(
    udf: type,
    config: RunConfig,
    run_dir: RunDir,
    todo: list[Question],
    retried: dict,
    client: Retriever,
    controller: StopController | None,
    engine_factory: Callable[[EngineConfig], Engine] | None,
    relay_worker_logs: bool,
) -> int:
    """The generation actors (``udf``, the stage's Ray Data UDF) over ``todo``, every batch written as a part; returns
    the rows written."""
    import ray

    logs = run_dir.path / "logs"
    info_path = run_dir.path / INFO_FILE
    gen = config.generation
    ledger = start_crash_ledger()
    try:
        stage = BatchStage(
            udf,
            {
                "config": config.model_dump(mode="json"),
                "retriever": client,
                "controller": controller,
                "engine_factory": engine_factory,
                "crash_ledger": ledger,
                "log_dir": None if relay_worker_logs else str(logs.resolve()),
            },
            actors=gen.actors,
            batch_size=gen.batch_size,
            num_cpus=gen.actor_num_cpus,
            num_gpus=gen.actor_num_gpus,
            resources=gen.resources or None,
            pool={
                "max_concurrent_calls_per_actor": gen.batches_per_actor,
                "enable_true_multi_threading": gen.batches_per_actor > 1,
            },
            # bounded, unlike Ray Data's defaults (unlimited): the crash ledger ends a question that kills
            # every engine; this ends a job whose actors die with no question in flight
            options={"max_restarts": gen.max_actor_restarts, "max_task_retries": gen.max_actor_restarts},
        )
        ds = stage.apply(ray.data.from_items(question_items(todo)))
        # A batch ends when its slowest trajectory does: on a CPU that can outlast Ray Data's 30-minute
        # no-progress guard; the driver's generation line shows that work goes on.
        ds.context.execution_no_progress_timeout_s = -1
        engines: list[dict] = []
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        progress = GenerationReporter(len(todo), engine_start_hint(config), log=log, turn_limit=config.agent.max_turns)
        try:
            with progress.heartbeat(ledger.read_status):
                for index, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pyarrow")):
                    if batch.num_rows == 0:
                        continue
                    if retried:  # the rerun's engine and retrieval answered: the new rows replace the old
                        drop_retried(run_dir, retried)
                        retried = {}
                    progress.wrote(write_batch(run_dir, batch, f"part-{stamp}-{index:05d}"))
                    engine = json.loads(batch.column("engine")[0].as_py())
                    if engine not in engines:  # one entry per distinct engine (actors share a configuration)
                        engines.append(engine)
                        update_info(info_path, engines=engines)
        except Exception:
            if not relay_worker_logs:  # e.g. vLLM's "See root cause above": it is in the actor's log
                show_actor_logs(logs)
            raise
        with contextlib.suppress(Exception):  # the closing line is not worth failing a finished job for
            progress.report(ledger.read_status())
        return progress.written
    finally:
        ray.kill(ledger.handle)
