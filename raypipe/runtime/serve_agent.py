"""The agent loop as a Ray Serve application (``raypipe serve-agent``): a question in, one trajectory, the answer out.

``deploy_agent(config, retriever, host, port, ...)`` runs the application ``serve_agent.deployment``:
``serve_agent.replicas`` replicas (or Serve's autoscaling with ``serve_agent.autoscaling``), each with
``serve_agent.num_cpus`` / ``num_gpus`` / ``resources``, each holding one engine
(:class:`~raypipe.runtime.answering.AgentAnswerer`: the probe job's engine start and loop) and a copy of one
retrieval client that every replica shares (``retriever``, opened once by the command: the retrieval actors
it started over the index, a ``serve-retrieval`` deployment, or a Search-R1 ``/retrieve`` URL; a replica that
autoscaling adds starts no retrieval of its own), behind Serve's HTTP proxy at ``http://HOST:PORT``. It waits
at most ``serve_agent.start_timeout_s`` for the replicas (:class:`AgentStartError`, naming what each asks).
Routes:

- ``POST /v1/answer``: :mod:`raypipe.agents.answer_api`'s request and reply; ``"stream": true`` answers with
  server-sent events: one ``iteration`` event per iteration row, then ``answer`` (or ``error``).
- ``POST /v1/chat/completions``: OpenAI's chat request (the last user message is the question) and reply
  (the answer as the message, raypipe's reply under ``raypipe``), streamed as OpenAI streams on request;
  ``GET /v1/models``.
- ``GET /health`` (the replica, its engine, policies, limits and counts) and ``GET /ready`` (503 while the
  replica is full).

Limits: a replica answers at most ``serve_agent.max_in_flight`` questions at once and refuses more at once
with 429 (``Retry-After``); Serve holds at most ``serve_agent.max_queued`` requests not yet routed and
refuses more with 503; a question past ``serve_agent.timeout_s`` gets 408 and its trajectory is cancelled;
bodies over ``serve_agent.max_body_bytes`` get 413 before they are read. With a token (``--token`` or
:data:`~raypipe.core.http.TOKEN_ENV`, as ``serve-retrieval``) every request needs
``Authorization: Bearer TOKEN``. Bad requests get a 4xx whose JSON ``detail`` is one line.

Metrics (Ray's Prometheus export, through ``ray.serve.metrics``): ``raypipe_agent_requests`` (by policy and
outcome), ``raypipe_agent_iterations``, ``raypipe_agent_iterations_left`` (the turn limit's searching turns minus
the iterations run, of trajectories a policy stopped), ``raypipe_agent_tokens`` (by kind), ``raypipe_agent_latency_s``,
``raypipe_agent_in_flight``; with a controller, ``raypipe_agent_controller_s`` (seconds trajectories waited for its
decisions) and ``raypipe_agent_controller_wall_s`` (those trajectories' wall seconds): their ratio is the
controller's share of wall time (``/health``'s counts hold both).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.metrics import Counter, Gauge, Histogram
from ray.serve.schema import ApplicationStatus

from raypipe.agents.answer_api import (
    Answer,
    AnswerRequest,
    ApiError,
    answer_body,
    chat_body,
    chat_chunks,
    iteration_view,
    parse_answer_request,
    parse_chat_request,
    sse,
)
from raypipe.agents.loop import IterationObserver
from raypipe.core.config import EngineConfig, RunConfig
from raypipe.core.http import one_line
from raypipe.core.rows import IterationRow
from raypipe.llm.base import Engine
from raypipe.retrieval.types import Retriever
from raypipe.runtime.answering import Admission, AgentAnswerer, PolicyBook, within_deadline
from raypipe.runtime.retrieval import placement
from raypipe.runtime.service import RequestGate, replica_gate, start_proxy, undeploy_app, warn_if_open
from raypipe.stopping.policies import check_policy

HEADROOM = 8  # Serve lets this many requests more than max_in_flight reach a replica: /health, /ready, the 429s
LATENCY_BUCKETS = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600]
INTERNAL_ERROR = "the replica failed to answer (its log has the error)"  # a 500's detail: nothing of the replica

log = logging.getLogger(__name__)

api = FastAPI(title="raypipe agent", description="Questions answered by raypipe's agent loop, with early stopping")
api.add_middleware(RequestGate, settings=replica_gate, body_setting="serve_agent.max_body_bytes")


@api.exception_handler(ApiError)
async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, exc.status, exc.headers)


@api.exception_handler(Exception)
async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
    """A failure that is no refusal: a 500 naming nothing of the replica (its log has the traceback)."""
    log.error("a request failed", exc_info=exc)
    return JSONResponse({"detail": INTERNAL_ERROR}, 500)


def load_policies(config: RunConfig, controller: str | None, stoprag: str | None) -> PolicyBook:
    """The replica's policies: the predictor bundle at ``controller`` and the Q-network at ``stoprag`` loaded
    (both optional; imported here, as they pull in torch and the feature extractors)."""
    predictor = stoprag_controller = None
    if controller is not None:
        from raypipe.stopping.online import load_bundle_predictor

        predictor = load_bundle_predictor(controller, config)
    if stoprag is not None:
        from raypipe.stoprag.qnet import StopRagController

        stoprag_controller = StopRagController(stoprag)
    return PolicyBook(config.stopping, predictor, stoprag_controller)


class ServiceMetrics:
    """The replica's Prometheus metrics (module docstring) and the same counts for ``/health``."""

    def __init__(self):
        self.requests = Counter("raypipe_agent_requests", "Questions by policy and outcome", ("policy", "outcome"))
        self.iterations = Counter("raypipe_agent_iterations", "Retrieval iterations run", ("policy",))
        self.left = Counter(
            "raypipe_agent_iterations_left",
            "The turn limit's searching turns minus the iterations run, of trajectories a policy stopped",
            ("policy",),
        )
        self.tokens = Counter("raypipe_agent_tokens", "Engine tokens by kind (prompt, cached, generated)", ("kind",))
        self.latency = Histogram(
            "raypipe_agent_latency_s", "Seconds from arrival to answer", LATENCY_BUCKETS, ("policy",)
        )
        self.controller_s = Counter(
            "raypipe_agent_controller_s", "Seconds trajectories waited for their controller's decisions", ("policy",)
        )
        self.controller_wall_s = Counter(
            "raypipe_agent_controller_wall_s", "Wall seconds of the trajectories a controller decided on", ("policy",)
        )
        self.in_flight = Gauge("raypipe_agent_in_flight", "Questions being answered")
        self.counts: Tally[str] = Tally()

    def answered(self, answer: Answer, seconds: float) -> None:
        policy, trajectory = answer.request.policy.name, answer.output.trajectory
        self.outcome(policy, "answered")
        generated = (trajectory["tokens_generated"] or 0) + (trajectory["probe_tokens"] or 0)
        for counter, value, tags in (
            (self.iterations, trajectory["n_iterations"], {"policy": policy}),
            (self.left, answer.iterations_left, {"policy": policy}),
            (self.tokens, trajectory["prompt_tokens"], {"kind": "prompt"}),
            (self.tokens, trajectory["cached_tokens"], {"kind": "cached"}),
            (self.tokens, generated, {"kind": "generated"}),
        ):
            if value:  # a Ray counter takes positive steps only (null: a backend that does not report it)
                counter.inc(value, tags)
        self.latency.observe(seconds, {"policy": policy})
        decisions = [r["decision_s"] for r in answer.output.iterations if r["decision_s"] is not None]
        if decisions:  # the controller's share of wall time: controller_s over controller_wall_s
            # the loop's row: wall_s is null only in the row of a question that crashed its engine
            deciding = {"controller_s": sum(decisions), "controller_wall_s": trajectory["wall_s"] or 0.0}
            self.controller_s.inc(deciding["controller_s"], {"policy": policy})
            self.controller_wall_s.inc(deciding["controller_wall_s"], {"policy": policy})
            self.counts.update(deciding)
        self.counts.update(
            {
                "iterations": trajectory["n_iterations"],
                "iterations_left": answer.iterations_left,
                "generated_tokens": generated,
            }
        )

    def outcome(self, policy: str, outcome: str) -> None:
        self.requests.inc(1, {"policy": policy, "outcome": outcome})
        self.counts[outcome] += 1


def stream_failure(exc: Exception) -> dict[str, Any]:
    """What a stream's last event says of a failure: a refusal's status and detail, or, for anything else, a 500
    that names nothing of the replica (no exception text, no path); the replica's log has the traceback."""
    if isinstance(exc, ApiError):
        return {"status": exc.status, "detail": exc.detail}
    log.error("a streamed answer failed", exc_info=exc)
    return {"status": 500, "detail": INTERNAL_ERROR}


class TrajectoryStream(StreamingResponse):
    """Server-sent events of one admitted request whose trajectory (``work``) ends with the response however the
    response ends: a client that leaves, even before the first event (when the events' generator never starts,
    so no cleanup of its own would run), cancels it and frees its slot."""

    def __init__(self, events: AsyncIterator[str], work: asyncio.Future):
        super().__init__(events, media_type="text/event-stream")
        self.work = work

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.work.cancel()  # a finished trajectory is not affected


# Defined above the deployment: @serve.ingress pickles the routes with the module's names as they are then.
@serve.deployment
@serve.ingress(api)
class AgentDeployment:
    """One replica: an :class:`AgentAnswerer` behind the routes, its admission bound and its metrics."""

    async def __init__(
        self,
        config: dict[str, Any],
        retriever: Retriever,
        token: str | None = None,
        controller: str | None = None,
        stoprag: str | None = None,
        log_run: str | None = None,
        engine_factory: Callable[[EngineConfig], Engine] | None = None,
    ):
        self.config = RunConfig.model_validate(config)
        self.limits, self.token = self.config.serve_agent, token  # replica_gate reads both
        policies = await asyncio.to_thread(load_policies, self.config, controller, stoprag)
        self.answerer = await AgentAnswerer.start(self.config, retriever, policies, engine_factory, log_run)
        self.admission = Admission(self.limits.max_in_flight)
        self.metrics = ServiceMetrics()

    @api.post("/v1/answer")
    async def answer(self, request: Request) -> Any:
        parsed = parse_answer_request(await request.body(), self.limits)
        check_policy(parsed.policy)
        if parsed.stream:
            rows: asyncio.Queue[IterationRow | None] = asyncio.Queue()
            work = self._admitted(parsed, rows.put_nowait)  # refused (429, 400) before the stream starts
            return TrajectoryStream(self._events(work, rows), work)
        return answer_body(await self._admitted(parsed))

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Any:
        chat, parsed = parse_chat_request(await request.body(), self.limits)
        check_policy(parsed.policy)
        reply_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if chat.stream:
            work = self._admitted(parsed, None)

            async def chunks() -> AsyncIterator[str]:
                try:
                    reply = chat_body(answer_body(await work), self.limits.model_name, reply_id, created)
                except Exception as exc:  # noqa: BLE001 - the stream has begun (200): its last chunk says what failed
                    failure = stream_failure(exc)
                    yield sse({"error": {"message": failure["detail"], "code": failure["status"]}})
                    return
                for chunk in chat_chunks(reply):
                    yield sse(chunk)
                yield sse("[DONE]")

            return TrajectoryStream(chunks(), work)
        return chat_body(answer_body(await self._admitted(parsed)), self.limits.model_name, reply_id, created)

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.limits.model_name, "object": "model", "owned_by": "raypipe"}]}

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "replica": serve.get_replica_context().replica_id.unique_id,
            **self.answerer.describe(),
            "in_flight": self.admission.in_flight,
            "counts": dict(self.metrics.counts),
            "limits": {
                k: v
                for k, v in self.limits.model_dump().items()
                if k
                in (
                    "max_in_flight",
                    "max_queued",
                    "timeout_s",
                    "max_body_bytes",
                    "max_question_chars",
                    "max_turns_limit",
                )
            },
            "token": self.token is not None,
        }

    @api.get("/ready")
    async def ready(self) -> JSONResponse:
        full = self.admission.in_flight >= self.limits.max_in_flight
        return JSONResponse({"ready": not full, "in_flight": self.admission.in_flight}, 503 if full else 200)

    def _admitted(self, parsed: AnswerRequest, observer: IterationObserver | None = None) -> asyncio.Future:
        """Check the policy is offered (400), take an in-flight slot (429 when none is left) and start the request's
        trajectory, which gives the slot back when it ends however it ends (a stream's client may never read it)."""
        try:
            self.answerer.policies.check(parsed.policy)
            self.admission.enter()
        except ApiError:
            self.metrics.outcome(parsed.policy.name, "rejected")
            raise
        self.metrics.in_flight.set(self.admission.in_flight)
        work = asyncio.ensure_future(self._run(parsed, observer))
        work.add_done_callback(self._finished)  # registered first: the slot is back before any awaiter resumes
        return work

    def _finished(self, _work: asyncio.Future) -> None:
        """A request's slot back however its trajectory ended: answered, failed, or cancelled, even before it began
        (its coroutine then never runs)."""
        self.admission.leave()
        self.metrics.in_flight.set(self.admission.in_flight)

    async def reset_prefix_cache(self) -> bool:
        """Handle call (benchmarks): empty the engine's prefix cache, so no run inherits another's."""
        return await self.answerer.engine.reset_prefix_cache()

    async def _run(self, parsed: AnswerRequest, observer: IterationObserver | None) -> Answer:
        started = time.monotonic()
        try:
            answer = await within_deadline(self.answerer.answer(parsed, observer), self.limits.timeout_s)
        except ApiError as exc:
            self.metrics.outcome(parsed.policy.name, "timeout" if exc.status == 408 else "refused")
            raise
        except Exception:
            self.metrics.outcome(parsed.policy.name, "error")
            raise
        self.metrics.answered(answer, time.monotonic() - started)
        return answer

    async def _events(self, work: asyncio.Future, rows: asyncio.Queue) -> AsyncIterator[str]:
        """The stream of one admitted request: its iteration rows as they come, then the answer (or the error)."""
        work.add_done_callback(lambda _: rows.put_nowait(None))
        while (row := await rows.get()) is not None:
            yield sse(iteration_view(row, self.answerer.config.retrieval.top_k), "iteration")
        try:
            yield sse(answer_body(await work), "answer")
        except Exception as exc:  # noqa: BLE001 - the stream has begun (200): its last event says what failed
            yield sse(stream_failure(exc), "error")


def agent_app(
    config: RunConfig,
    retriever: Retriever,
    token: str | None = None,
    controller: str | None = None,
    stoprag: str | None = None,
    log_run: str | None = None,
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
):
    """The Serve application; ``retriever`` (every replica gets a copy: it must pickle) and ``engine_factory``
    (tests, benchmarks; picklable)."""
    cfg = config.serve_agent
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "resources": cfg.resources},
        "max_ongoing_requests": cfg.max_in_flight + HEADROOM,
        "max_queued_requests": cfg.max_queued,
        "logging_config": {"enable_access_log": False},
    }
    if cfg.autoscaling is not None:
        options["autoscaling_config"] = cfg.autoscaling
    else:
        options["num_replicas"] = cfg.replicas
    return AgentDeployment.options(**options).bind(
        config.model_dump(mode="json"),
        retriever,
        token,
        controller,
        stoprag,
        None if log_run is None else str(Path(log_run).resolve()),
        engine_factory,
    )


def deploy_agent(
    config: RunConfig,
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    **app_args: Any,
) -> str:
    """Start Serve's HTTP proxy at ``host:port`` (on the connected Ray), run the application and wait until every
    replica has started its engine (at most ``serve_agent.start_timeout_s``: :class:`AgentStartError`); returns
    the base URL. ``app_args``: :func:`agent_app`'s."""
    warn_if_open(host, port, token, "spend this server's engine")
    cfg = config.serve_agent
    start_proxy(host, port, cfg.timeout_s)
    app = agent_app(config, retriever, token, **app_args)
    serve.run_many([serve.RunTarget(app, cfg.deployment, cfg.route_prefix)], wait_for_applications_running=False)
    wait_running(cfg.deployment, cfg.start_timeout_s, placement(cfg.num_cpus, cfg.num_gpus, cfg.resources))
    return f"http://{host}:{port}{cfg.route_prefix.rstrip('/')}"


class AgentStartError(RuntimeError):
    """The agent application did not run within ``serve_agent.start_timeout_s``, or failed to start (one line)."""


def wait_running(name: str, timeout_s: float, asks: str) -> None:
    """Until the application ``name`` runs: :class:`AgentStartError` when it fails to deploy, or is still deploying
    after ``timeout_s`` (its replicas wait for resources the cluster lacks, or their engines for longer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(name)
        state = None if app is None else app.status
        if state == ApplicationStatus.RUNNING:
            return
        if state in (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY):
            raise AgentStartError(f"the agent application {name!r} failed to start: {one_line(app.message, 600)}")
        if time.monotonic() > deadline:
            raise AgentStartError(
                f"the agent application {name!r} was not running within {timeout_s:g} s (serve_agent.start_timeout_s):"
                f" each replica asks {asks} and starts an engine; check the cluster has them (`ray status`)"
            )
        time.sleep(0.5)


def undeploy_agent(config: RunConfig) -> None:
    undeploy_app(config.serve_agent.deployment)
