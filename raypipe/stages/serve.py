"""The serve-retrieval job: the retrieval index as a shared Ray Serve deployment speaking Search-R1's HTTP API,
up until SIGINT/SIGTERM (``raypipe serve-retrieval``, ``python jobs/serve.py``).

The deployment is :mod:`raypipe.runtime.serve`; jobs (the probe and the features stages) reach it by URL
(``retrieval.backend: http``) or, on the same Ray cluster, by name (``retrieval.backend: serve``).
"""

from __future__ import annotations

import sys
import threading

from raypipe.core.config import ConfigError, RunConfig
from raypipe.core.jobargs import config_from_args, setup_logging
from raypipe.data.loaders import DataError
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.runtime import service
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.index_build import ensure_index

DESCRIPTION = """Serve the retrieval index to other jobs and tools: Search-R1's POST /retrieve and GET /health (Ray Serve).

Builds or reuses the configured index (as `raypipe index` does), deploys it as the Ray Serve application
retrieval.serve.deployment with retrieval.actors.replicas replicas (retrieval.actors.num_cpus / num_gpus each, CPU or GPU
FAISS as retrieval.index.faiss_gpu says; Serve's request batching up to retrieval.actors.max_batch_size
requests, retrieval.actors.max_wait_ms), prints the URL once every replica is ready, and serves until SIGINT or SIGTERM,
then deletes the deployment. Point jobs at it with --set retrieval.backend=http --set retrieval.http.url=URL,
or on the same Ray cluster (ray.address) with --set retrieval.backend=serve. Besides Search-R1's API it
answers raypipe's corpus calls under /raypipe/ (passage vectors, document frequencies, query vectors),
which `raypipe features` needs and a plain Search-R1 server lacks.
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`


def serve_until_stopped(
    config: RunConfig, host: str, port: int, stop: threading.Event, token: str | None = None
) -> None:
    """Deploy over the configured index, print the URL, wait for ``stop``, then delete the deployment."""
    from raypipe.runtime.serve import deploy_retrieval

    index_path = ensure_index(config)
    cfg = config.retrieval
    service.serve_until_stopped(
        stop,
        lambda: deploy_retrieval(config, index_path, host, port, token),
        lambda url: (
            f"retrieval service ready at {url}  (POST {url}/retrieve, GET {url}/health; Ray Serve application "
            f"{cfg.serve.deployment!r}, {cfg.actors.replicas} replica(s))"
        ),
        cfg.serve.deployment,
        "retrieval service",
    )


def main() -> None:
    args = service.service_parser(DESCRIPTION).parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)

    import ray

    init_ray(config)
    stop = service.stop_on_signals()
    try:
        serve_until_stopped(config, args.host, args.port, stop, args.token or None)
    except (ConfigError, DataError, FileNotFoundError, RetrievalIndexError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    print("retrieval service stopped", flush=True)
