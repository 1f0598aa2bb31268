"""The body of a ``raypipe serve-agent`` replica, without Ray: one engine, one retriever, a trajectory per request.

:class:`AgentAnswerer` starts its engine as a probe generation actor does (the same factory and warm-up,
:func:`~raypipe.runtime.generation.prepare_engine`) and answers each request with the probe job's own loop
(:func:`~raypipe.agents.factory.build_loop`), built per request for its stopping policy and turn limit, so
every request in flight shares the engine (vLLM batches them continuously) and the retriever. Each request's
question gets a unique qid: controllers that keep per-trajectory state key it by qid.

:class:`PolicyBook` turns a request's :class:`~raypipe.agents.answer_api.Policy` into a controller through the
registry :mod:`raypipe.stopping.policies`: natural (none), Cap@k, the 4-state heuristic (with the request's
thresholds, on the one predictor bundle the replica loaded, its P̂/Û recorded for the answer; the requests waiting on
a decision are predicted together) and Stop-RAG (the
replica's Q-network). A policy whose bundle the server did not load is a 400.

:class:`RequestLog` (``--log-run RUN_DIR``) writes every answered request as rows of the probe job's
``trajectories/`` and ``iterations/`` tables (:func:`~raypipe.runtime.generation.write_batch`, one part per
request) under the run files the probe job writes, so the later stages read the log as a probe run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from raypipe.agents import build_loop, build_protocol
from raypipe.agents.answer_api import (
    Answer,
    AnswerRequest,
    ApiError,
    Policy,
    Predictions,
    request_question,
)
from raypipe.agents.hooks import StopController
from raypipe.agents.loop import IterationObserver, TrajectoryOutput
from raypipe.agents.probe_run import INFO_FILE, check_resumable, run_info
from raypipe.core.config import EngineConfig, RunConfig, StoppingConfig
from raypipe.core.rundir import RunDir
from raypipe.core.schema import STOP_CONTROLLER
from raypipe.llm.base import Engine
from raypipe.llm.factory import build_engine
from raypipe.retrieval.types import Retriever
from raypipe.runtime.cluster import current_node_id
from raypipe.runtime.generation import prepare_engine, to_table, write_batch
from raypipe.stopping.batching import PredictionBatcher, Predictor
from raypipe.stopping.policies import Loaded, build_controller, check_offered, offered

log = logging.getLogger(__name__)

# What /health shows of an engine's record (raypipe.llm.common.engine_record and the backends' settings): none of
# them a path or an address.
PUBLIC_ENGINE_FIELDS = (
    "backend",
    "dtype",
    "max_model_len",
    "supports_regex",
    "start_seconds",
    "block_size",
    "enable_prefix_caching",
    "served_model",
)


def model_name(engine: EngineConfig) -> str:
    """The model as a client may see it: an embedded name as configured, a local folder or file by its last part."""
    return Path(engine.model).name


class RecordingSource:
    """One request's view of the replica's shared prediction batcher: each prediction recorded by iteration for the
    request's answer."""

    def __init__(self, shared: PredictionBatcher, record: Predictions):
        self.shared, self.record = shared, record

    async def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]:
        p_hat, u_hat = await self.shared.predict(history_rows, question)
        self.record[int(history_rows[-1]["iteration"])] = (p_hat, u_hat)
        return p_hat, u_hat


class PolicyBook:
    """The stopping policies a replica offers (module docstring; the registry
    :data:`~raypipe.stopping.policies.POLICIES`). ``predictor``: the heuristic's bundle (``--controller``), whose
    predictions for all the requests waiting on a decision run together (one batcher for the replica);
    ``stoprag``: the Stop-RAG controller (``--stoprag``); ``stopping``: the server's default thresholds and variant."""

    def __init__(
        self, stopping: StoppingConfig, predictor: Predictor | None = None, stoprag: StopController | None = None
    ):
        self.stopping, self.stoprag = stopping, stoprag
        self.batcher = None if predictor is None else PredictionBatcher(lambda: predictor)

    def check(self, policy: Policy) -> None:
        """A 400 for a policy this server does not offer (its bundle not loaded)."""
        check_offered(policy, Loaded(self.stopping, self.batcher, self.stoprag))

    def controller(self, policy: Policy) -> tuple[StopController | None, str, Predictions]:
        """The controller of one request's policy, the policy as run, and where its predictions are recorded."""
        predictions: Predictions = {}
        recorder = None if self.batcher is None else RecordingSource(self.batcher, predictions)
        controller, label = build_controller(policy, Loaded(self.stopping, recorder, self.stoprag))
        return controller, label, predictions

    def offered(self) -> list[str]:
        return offered(Loaded(self.stopping, self.batcher, self.stoprag))


class RequestLog:
    """Answered requests as a probe run's tables in ``run_dir`` (module docstring); one part per request."""

    def __init__(self, run_dir: RunDir, config: RunConfig, engine_json: str):
        check_resumable(config, run_dir)  # a log of other agent/engine/retrieval settings is refused
        run_dir.path.mkdir(parents=True, exist_ok=True)
        run_dir.write_config(config)
        service = {"command": "raypipe serve-agent", "deployment": config.serve_agent.deployment}
        info = {**run_info(config), "service": service}
        (run_dir.path / INFO_FILE).write_text(yaml.safe_dump(info, sort_keys=False))
        self.run_dir, self.engine_json = run_dir, engine_json
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.prefix = f"part-{stamp}-{uuid.uuid4().hex[:8]}"  # replicas write side by side
        self._numbers = itertools.count(1)  # one part number per request, taken once under the lock
        self._lock = threading.Lock()

    def write(self, output: TrajectoryOutput) -> None:
        """Write one request's rows as its own part (called from one worker thread per request)."""
        with self._lock:
            number = next(self._numbers)
        write_batch(self.run_dir, to_table([output], self.engine_json), f"{self.prefix}-{number:06d}")


class AgentAnswerer:
    """One replica's answers (module docstring); build it with :meth:`start`."""

    def __init__(
        self,
        config: RunConfig,
        engine: Engine,
        retriever: Retriever,
        policies: PolicyBook,
        request_log: RequestLog | None = None,
    ):
        self.config, self.engine, self.retriever, self.policies = config, engine, retriever, policies
        self.request_log = request_log
        self.protocol = build_protocol(config.agent)

    @classmethod
    async def start(
        cls,
        config: RunConfig,
        retriever: Retriever,
        policies: PolicyBook,
        engine_factory: Callable[[EngineConfig], Engine] | None = None,
        log_run: str | Path | None = None,
    ) -> AgentAnswerer:
        """Start the engine (in a worker thread: vLLM's start blocks) and warm it up as a generation actor does."""
        built = await asyncio.to_thread(engine_factory or build_engine, config.engine)
        engine = await prepare_engine(built, config, build_protocol(config.agent))
        request_log = None
        if log_run is not None:
            engine_json = json.dumps({**engine.describe(), "node_id": current_node_id()})
            request_log = await asyncio.to_thread(RequestLog, RunDir(log_run), config, engine_json)
        return cls(config, engine, retriever, policies, request_log)

    def config_for(self, request: AnswerRequest) -> RunConfig:
        """The config a request runs under: the server's, with the request's ``max_turns``."""
        if request.max_turns is None:
            return self.config
        agent = self.config.agent.model_copy(update={"max_turns": request.max_turns})
        return self.config.model_copy(update={"agent": agent})

    async def answer(self, request: AnswerRequest, observer: IterationObserver | None = None) -> Answer:
        """One trajectory for ``request`` (``observer`` is told of each iteration row as it is added); the row
        is written to the request log, if any, before the answer returns."""
        controller, policy, predictions = self.policies.controller(request.policy)
        config = self.config_for(request)
        loop = build_loop(config, self.engine, self.retriever, self.protocol, controller)
        question = request_question(request, f"serve-{uuid.uuid4().hex}")
        output = await loop.run(question, observer)
        if self.request_log is not None:
            await asyncio.to_thread(self.request_log.write, output)
        searching = self.protocol.turn_plan(config.agent)[1]
        trajectory = output.trajectory
        left = max(searching - trajectory["n_iterations"], 0) if trajectory["stop_reason"] == STOP_CONTROLLER else 0
        return Answer(request, output, policy, predictions, config.retrieval.top_k, left)

    def describe(self) -> dict[str, Any]:
        """What ``/health`` shows of the replica's engine, agent and policies: no file path, no address (the
        engine's record names its model, not where it was loaded from; the request log is on or off)."""
        record = self.engine.describe()
        engine = {key: record[key] for key in PUBLIC_ENGINE_FIELDS if key in record}
        engine["model"] = model_name(self.config.engine)
        return {
            "engine": engine,
            "protocol": self.protocol.name,
            "max_turns": self.config.agent.max_turns,
            "documents_read": self.config.retrieval.top_k,
            "policies": self.policies.offered(),
            "request_log": self.request_log is not None,
        }

    async def close(self) -> None:
        await self.engine.close()


class Admission:
    """The bound on questions in flight on one replica: a request past it is refused at once (429), never queued
    behind the engine's work (Serve's own queue, ``serve_agent.max_queued``, holds the ones not yet routed)."""

    def __init__(self, limit: int):
        self.limit, self.in_flight = limit, 0

    def enter(self) -> None:
        if self.in_flight >= self.limit:
            raise ApiError(
                429,
                f"this replica is answering {self.in_flight} questions, its limit "
                "(serve_agent.max_in_flight): retry later",
                {"Retry-After": "1"},
            )
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


async def within_deadline(work, timeout_s: float):
    """``work``'s result, or a 408 :class:`ApiError` after ``timeout_s`` (the trajectory is cancelled: its engine
    requests are aborted)."""
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:  # asyncio.TimeoutError is this builtin from Python 3.11
        raise ApiError(408, f"no answer within {timeout_s:g} s (serve_agent.timeout_s)") from None
