"""A loopback HTTP server whose every answer a script decides: slow, dripping, oversized, garbage, refused or
hung up. For testing a client of a retrieval service (raypipe's :class:`~raypipe.retrieval.http_client.
HttpRetriever`, or your own) against the ways a server fails; ``benchmarks/service_faults.py`` runs it.

    server = FaultyServer(lambda request: Reply(body=b"[1, 2]"))      # valid JSON, wrong type
    ...  # point the client at server.url
    server.requests                                                   # what the client sent
    server.stop()

:func:`search_r1_answer` is a well-formed ``POST /retrieve`` answer (Search-R1's format) to build scripts on.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server does with one request.

    ``delay_s`` before the status line; ``drip_s`` between the body's bytes (a server that answers a byte at a
    time); ``sized``: send ``Content-Length`` (else the body ends when the connection closes);
    ``hang_up``: close the connection without answering."""

    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0
    drip_s: float = 0.0
    sized: bool = True
    hang_up: bool = False


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the decoded JSON body (None for a GET)


@dataclass
class FaultyServer:
    """Answers every request on 127.0.0.1 (a free port) with ``script(request)``; records each request."""

    script: Callable[[Received], Reply]
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: an unsized body ends at the close

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(None)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(json.loads(raw) if raw else None)

            def _answer(self, body: Any) -> None:
                request = Received(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                server.requests.append(request)
                reply = server.script(request)
                time.sleep(reply.delay_s)
                if reply.hang_up:
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                if reply.sized:
                    self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                try:
                    if reply.drip_s:
                        for i in range(len(reply.body)):
                            self.wfile.write(reply.body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(reply.drip_s)
                    else:
                        self.wfile.write(reply.body)
                except OSError:  # the client gave up
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (a later request is refused)."""
        self._httpd.shutdown()
        self._httpd.server_close()


def search_r1_answer(request: Received) -> dict[str, Any]:
    """Search-R1's answer to a ``POST /retrieve``: ``topk`` hits per query, ids ``QUERY-i``, falling scores."""
    queries, k = request.body["queries"], request.body["topk"]
    return {
        "result": [
            [
                {
                    "document": {"id": f"{q}-{i}", "contents": f'"Title {i}"\npassage {i} about {q}'},
                    "score": 1.0 - i / (k + 1),
                }
                for i in range(k)
            ]
            for q in queries
        ]
    }


def json_reply(value: Any, **options: Any) -> Reply:
    return Reply(body=json.dumps(value).encode(), **options)
