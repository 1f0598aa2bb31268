"""What both raypipe HTTP services share (``raypipe serve-retrieval``: :mod:`raypipe.runtime.serve`;
``raypipe serve-agent``: :mod:`raypipe.runtime.serve_agent`): the command's flags (:func:`service_parser`), its
stop signals, the serve-until-stopped loop, Serve's proxy, the request gate every route sits behind (bearer
token and body size, :class:`RequestGate`), the warning for a server open to other machines without a token,
and deleting an application.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.exceptions import RayServeException

from raypipe.core.http import TOKEN_ENV
from raypipe.core.jobargs import job_parser

LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger(__name__)


def service_parser(description: str) -> argparse.ArgumentParser:
    """A job parser with the flags of every raypipe HTTP service (serve-retrieval, serve-agent)."""
    parser = job_parser(description)
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000, Search-R1's)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0: every machine that reaches this one; set a token)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token every HTTP request must carry (default: ${TOKEN_ENV}, which keeps it out "
        "of the process list; the HTTP client sends it from there; none: no authentication)",
    )
    return parser


def stop_on_signals() -> threading.Event:
    """The event SIGINT and SIGTERM set; a service serves until it is set."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def serve_until_stopped(
    stop: threading.Event, deploy: Callable[[], str], ready: Callable[[str], str], app: str, what: str
) -> None:
    """Run ``deploy()`` (it returns the base URL), print ``ready(url)``, wait for ``stop``, then delete the Serve
    application ``app`` (also when ``deploy`` failed). ``what``: the service, as the log names it."""
    try:
        url = deploy()
        print(f"{ready(url)}; Ctrl-C stops it", flush=True)
        while not stop.wait(1.0):
            pass
        log.info("stopping the %s", what)
    finally:
        undeploy_app(app)


def warn_if_open(host: str, port: int, token: str | None, exposes: str) -> None:
    """Warn when ``host`` is not a loopback address and no token guards it: anyone reaching the port ``exposes``."""
    if host not in LOOPBACK and not token:
        log.warning(
            "listening on %s without a token: anyone who can reach port %d can %s; set --token or %s",
            host,
            port,
            exposes,
            TOKEN_ENV,
        )


def start_proxy(host: str, port: int, deadline_s: float) -> None:
    """Start Serve's HTTP proxy at ``host:port``, ending every request ``deadline_s`` after it arrived there (Serve's
    queue included: a 408 from the proxy, which cancels the request on its replica). A proxy already running on the
    cluster keeps its own settings (Serve warns when they differ)."""
    serve.start(http_options={"host": host, "port": port, "request_timeout_s": deadline_s})


def undeploy_app(name: str) -> None:
    """Delete the Serve application ``name``, then Serve itself (its proxy and controller) if nothing else runs on
    it."""
    try:
        serve.delete(name)
    except RayServeException:  # Serve never started (the deployment failed first): nothing to delete
        return
    if not serve.status().applications:
        serve.shutdown()


class RequestGate:
    """ASGI middleware in front of the routes: the bearer token, then the body's size, both checked before
    FastAPI reads or parses anything (a body is read up to the limit, never further). ``settings()`` gives
    the serving replica's ``(token, max_body_bytes)``; ``body_setting`` names the limit in the 413's detail."""

    def __init__(
        self,
        app: Any,
        settings: Callable[[], tuple[str | None, int]],
        body_setting: str = "retrieval.serve.max_body_bytes",
    ):
        self.app, self.settings, self.body_setting = app, settings, body_setting

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token, max_bytes = self.settings()
        headers = dict(scope["headers"])
        if token and not hmac.compare_digest(headers.get(b"authorization", b""), f"Bearer {token}".encode()):
            detail = f"this server wants the header `Authorization: Bearer TOKEN` (raypipe's client sends ${TOKEN_ENV})"
            await JSONResponse({"detail": detail}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        too_big = JSONResponse(
            {"detail": f"a request body over this server's limit of {max_bytes:,} bytes ({self.body_setting})"}, 413
        )
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > max_bytes:
            await too_big(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > max_bytes:
                await too_big(scope, receive, send)
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def replica_gate() -> tuple[str | None, int]:
    """The serving replica's token and body limit (the app and its middleware exist before any replica)."""
    replica = serve.get_replica_context().servable_object
    return replica.token, replica.limits.max_body_bytes
