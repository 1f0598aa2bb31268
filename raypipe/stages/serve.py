"""The serve-retrieval job: the retrieval index as a shared Ray Serve deployment speaking Search-R1's HTTP API,
up until SIGINT/SIGTERM (``raypipe serve-retrieval``, ``python jobs/serve.py``).

The deployment is :mod:`raypipe.runtime.serve`; jobs (the probe and the features stages) reach it by URL
(``retrieval.backend: http``) or, on the same Ray cluster, by name (``retrieval.backend: serve``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from raypipe.core.config import ConfigError, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.data.loaders import DataError
from raypipe.retrieval.http_client import TOKEN_ENV
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.runtime.cluster import init_ray
from raypipe.stages.index import ensure_index

DESCRIPTION = """Serve the retrieval index to other jobs and tools: Search-R1's POST /retrieve and GET /health (Ray Serve).

Builds or reuses the configured index (as `raypipe index` does), deploys it as the Ray Serve application
retrieval.deployment with retrieval.replicas replicas (retrieval.num_cpus / num_gpus each, CPU or GPU
FAISS as retrieval.faiss_gpu says; Serve's request batching up to retrieval.max_batch_size requests,
retrieval.max_wait_ms), prints the URL once every replica is ready, and serves until SIGINT or SIGTERM,
then deletes the deployment. Point jobs at it with --set retrieval.backend=http --set retrieval.url=URL,
or on the same Ray cluster (ray.address) with --set retrieval.backend=serve. Besides Search-R1's API it
answers raypipe's corpus calls under /raypipe/ (passage vectors, document frequencies, query vectors),
which `raypipe features` needs and a plain Search-R1 server lacks.
"""

log = logging.getLogger(__name__)


def serve_until_stopped(
    config: RunConfig, host: str, port: int, stop: threading.Event, token: str | None = None
) -> None:
    """Deploy over the configured index, print the URL, wait for ``stop``, then delete the deployment."""
    from raypipe.runtime.serve import deploy_retrieval, undeploy_retrieval

    index_path = ensure_index(config)
    try:
        url = deploy_retrieval(config, index_path, host, port, token)
        print(f"retrieval service ready at {url}  (POST {url}/retrieve, GET {url}/health; Ray Serve application "
              f"{config.retrieval.deployment!r}, {config.retrieval.replicas} replica(s)); Ctrl-C stops it", flush=True)  # fmt: skip
        while not stop.wait(1.0):
            pass
        log.info("stopping the retrieval service")
    finally:
        undeploy_retrieval(config)


def service_parser(description: str) -> argparse.ArgumentParser:
    """A job parser with the flags of every raypipe HTTP service (serve-retrieval, serve-agent)."""
    parser = job_parser(description)
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000, Search-R1's)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0: every machine that reaches this one; set a token)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"bearer token every HTTP request must carry (default: ${TOKEN_ENV}, which keeps it out "
                        "of the process list; the HTTP client sends it from there; none: no authentication)")
    return parser


def stop_on_signals() -> threading.Event:
    """The event SIGINT and SIGTERM set; a service serves until it is set."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def main() -> None:
    args = service_parser(DESCRIPTION).parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)

    import ray

    init_ray(config)
    stop = stop_on_signals()
    try:
        serve_until_stopped(config, args.host, args.port, stop, args.token or None)
    except (ConfigError, DataError, FileNotFoundError, RetrievalIndexError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    print("retrieval service stopped", flush=True)
