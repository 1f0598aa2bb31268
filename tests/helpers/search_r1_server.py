"""A small server in Search-R1's retrieval API (``POST /retrieve``), for the tests of the HTTP client and of
the features stage against a plain Search-R1 server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def documents_for(query: str, k: int) -> list[dict]:
    """What the toy server returns for a query: k hits with ids, quoted titles and falling scores."""
    return [
        {
            "document": {"id": f"{query}-{i}", "contents": f'"Title {i} of {query}"\npassage {i} about {query}'},
            "score": 1.0 - i / 8,
        }
        for i in range(k)
    ]


class SearchR1Server:
    """A ``POST /retrieve`` server in Search-R1's format (no ``/health``, as Search-R1's has none).

    ``mode``: "ok"; "slow" (sleeps ``delay_s`` first); "not_json"; "no_result"; "short" (one list too
    few); "no_score"; "bad_document"; "error500" (``fail_first`` times, then ok); "http400".
    ``die_after``: close the listening socket after that many /retrieve requests.
    """

    def __init__(self, mode: str = "ok", delay_s: float = 0.0, fail_first: int = 0, die_after: int | None = None):
        self.mode, self.delay_s, self.fail_first, self.die_after = mode, delay_s, fail_first, die_after
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # what FastAPI answers for a route it does not have
                self.send_response(404)
                self.send_header("Content-Length", "22")
                self.end_headers()
                self.wfile.write(b'{"detail":"Not Found"}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                status, payload = server.answer(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                if server.die_after is not None and len(server.requests) >= server.die_after:
                    threading.Thread(target=server.stop).start()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict) -> tuple[int, bytes]:
        queries, k = body["queries"], body["topk"]
        result = [documents_for(q, k) for q in queries]
        mode = self.mode
        if mode == "slow":
            time.sleep(self.delay_s)
        elif mode == "error500" and len(self.requests) <= self.fail_first:
            return 500, b'{"detail": "overloaded"}'
        elif mode == "http400":
            return 400, b'{"detail": "bad topk"}'
        elif mode == "not_json":
            return 200, b"<html>oops</html>"
        elif mode == "no_result":
            return 200, json.dumps({"results": result}).encode()
        elif mode == "short":
            result = result[:-1]
        elif mode == "no_score":
            result = [[hit["document"] for hit in ranked] for ranked in result]
        elif mode == "bad_document":
            result[0][0]["document"] = {"id": "x", "text": "no contents field"}
        return 200, json.dumps({"result": result}).encode()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
