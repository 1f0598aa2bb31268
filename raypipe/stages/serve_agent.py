"""The serve-agent job: the agent loop answering live questions as a Ray Serve application, up until SIGINT/SIGTERM
(``raypipe serve-agent``, ``python jobs/serve_agent.py``).

The deployment is :mod:`raypipe.runtime.serve_agent`; its replica's body :mod:`raypipe.runtime.answering`; the
HTTP contract :mod:`raypipe.agents.answer_api`. docs/serve-agent.md has the API and every setting.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

from raypipe.core.config import ConfigError, EngineConfig, RunConfig
from raypipe.core.jobargs import config_from_args, setup_logging
from raypipe.core.models import locate_llm
from raypipe.data.loaders import DataError
from raypipe.llm.base import Engine
from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.retrieval.types import Retriever
from raypipe.runtime import service
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.retrieval import RetrievalStartError

DESCRIPTION = """Answer questions live with the agent loop, each stopped by its own policy: POST /v1/answer (Ray Serve).

Deploys the Ray Serve application serve_agent.deployment: serve_agent.replicas replicas (or Serve's
autoscaling, serve_agent.autoscaling), each with its own engine (the probe job's: engine.*, agent.*), all
sharing one retrieval through retrieval.backend, opened once here (retrieval actors over the configured index,
built or reused as `raypipe index` does; a serve-retrieval deployment; a Search-R1 /retrieve URL). Each request runs one
trajectory with its own stopping policy: natural, cap (Cap@k), heuristic (the 4-state heuristic on the
--controller predictor bundle) or stoprag (the --stoprag Q-network). Routes: POST /v1/answer (JSON, or
server-sent events with "stream": true), the OpenAI-compatible POST /v1/chat/completions and GET /v1/models,
GET /health, GET /ready. It prints the URL once every replica's engine is warm and serves until SIGINT or
SIGTERM, then deletes the application. Example:

  curl -s http://127.0.0.1:8000/v1/answer -H 'Content-Type: application/json' \\
       -d '{"question": "Who directed Ed Wood?", "policy": {"name": "cap", "k": 1}}'

docs/serve-agent.md: the API, the policies, the limits (serve_agent.*), the metrics, cluster use.
"""


def bundle_paths(config: RunConfig, controller: str | None, stoprag: str | None) -> tuple[str | None, str | None]:
    """The bundle folders the flags name, checked here before any replica starts (FileNotFoundError otherwise)."""
    if controller is not None:
        from raypipe.stopping.online import bundle_folder

        controller = str(bundle_folder(controller))
    if stoprag is not None:
        from raypipe.stoprag.qnet import controller_from_path as qnet_from_path

        stoprag = str(qnet_from_path(stoprag).folder)
    return controller, stoprag


def serve_until_stopped(
    config: RunConfig,
    host: str,
    port: int,
    stop: threading.Event,
    token: str | None = None,
    controller: str | None = None,
    stoprag: str | None = None,
    log_run: str | None = None,
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
    retriever: Retriever | None = None,
) -> None:
    """Open the retrieval every replica shares (once: with ``retrieval.backend: actors`` the retrieval replicas
    start here, not in each agent replica), deploy, print the URL, wait for ``stop``, then delete the application
    and stop the retrieval replicas. ``engine_factory`` and ``retriever`` (tests, benchmarks; picklable) replace
    the configured engine and retrieval."""
    from raypipe.runtime.retrieval import open_retrieval
    from raypipe.runtime.serve_agent import deploy_agent

    controller, stoprag = bundle_paths(config, controller, stoprag)
    if engine_factory is None and config.engine.backend != "openai":
        locate_llm(config.engine.model)  # a missing model fails here, not in every replica
    shared = retriever if retriever is not None else open_retrieval(config)
    cfg = config.serve_agent
    try:
        service.serve_until_stopped(
            stop,
            lambda: deploy_agent(
                config,
                shared,
                host,
                port,
                token,
                controller=controller,
                stoprag=stoprag,
                log_run=log_run,
                engine_factory=engine_factory,
            ),
            lambda url: (
                f"agent service ready at {url}  (POST {url}/v1/answer, POST {url}/v1/chat/completions, "
                f"GET {url}/health; Ray Serve application {cfg.deployment!r})"
            ),
            cfg.deployment,
            "agent service",
        )
    finally:
        if retriever is None:
            shared.shutdown()


def main() -> None:
    parser = service.service_parser(DESCRIPTION)
    parser.add_argument(
        "--controller",
        metavar="BUNDLE",
        help="offer the heuristic policy: the predictor bundle at BUNDLE (a bundle folder or a run "
        "directory with models/, from `raypipe train`); default thresholds: stopping.theta_p/theta_u, "
        "stopping.variant",
    )
    parser.add_argument(
        "--stoprag",
        metavar="PATH",
        help="offer the stoprag policy: the Q-network at PATH (a network folder or a run directory "
        "with stoprag/qnet, from `raypipe stoprag`)",
    )
    parser.add_argument(
        "--log-run",
        metavar="RUN_DIR",
        help="write every answered request to RUN_DIR's trajectories/ and iterations/ (a probe run's "
        "tables, which the later stages read); on a cluster a path every replica's node shares",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    if args.log_run:
        args.log_run = str(Path(args.log_run).resolve())

    import ray

    from raypipe.runtime.serve_agent import AgentStartError

    init_ray(config)
    stop = service.stop_on_signals()
    try:
        serve_until_stopped(
            config, args.host, args.port, stop, args.token or None, args.controller, args.stoprag, args.log_run
        )
    except (
        AgentStartError,
        ConfigError,
        DataError,
        FileNotFoundError,
        RetrievalIndexError,
        RetrievalServerError,
        RetrievalStartError,
        ValueError,
    ) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    print("agent service stopped", flush=True)
