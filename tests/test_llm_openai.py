"""The OpenAI-compatible HTTP backend against a scripted fake server on 127.0.0.1."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from raypipe.core.config import EngineConfig
from raypipe.llm.base import ContextOverflowError, EngineError, EngineUnavailableError, GenerationRequest
from raypipe.llm.openai_engine import OpenAIEngine

OK_BODY = {
    "choices": [
        {
            "text": " Paris",
            "finish_reason": "stop",
            "stop_reason": "</answer>",
            "logprobs": {"tokens": [" Paris"], "token_logprobs": [-0.25]},
        }
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}},
}


class FakeServer:
    """Answers POST /v1/completions from a script of (status, body, delay_s); records requests."""

    def __init__(self):
        self.script: list[tuple[int, object, float]] = []
        self.requests: list[tuple[dict, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                status, reply, delay = server.script.pop(0) if server.script else (200, OK_BODY, 0.0)
                time.sleep(delay)
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out first
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    fake = FakeServer()
    yield fake
    fake.stop()


def make_engine(server, monkeypatch, **overrides):
    monkeypatch.setenv("RAYPIPE_TEST_KEY", "sekret")
    fields = dict(
        backend="openai",
        base_url=server.url + "/",
        model="served-name",
        api_key_env="RAYPIPE_TEST_KEY",
        max_retries=2,
        request_timeout_s=5,
    )
    fields.update(overrides)
    return OpenAIEngine(EngineConfig(**fields), backoff_s=0.01)


def run(engine, request):
    async def go():
        try:
            return await engine.generate(request)
        finally:
            await engine.close()

    return asyncio.run(go())


REQUEST = GenerationRequest(
    prompt="Q: capital of France?", max_tokens=16, stop=("</search>", "</answer>"), logprobs=True, seed=1
)


def test_completion_request_and_response(server, monkeypatch):
    gen = run(make_engine(server, monkeypatch), REQUEST)
    path, headers, body = server.requests[0]
    assert path == "/v1/completions"
    assert headers["Authorization"] == "Bearer sekret"
    assert body == {
        "model": "served-name",
        "prompt": "Q: capital of France?",
        "max_tokens": 16,
        "temperature": 0.0,
        "top_p": 1.0,
        "stop": ["</search>", "</answer>"],
        "seed": 1,
        "logprobs": 0,
    }
    assert gen.text == " Paris" and gen.token_logprobs == [-0.25]
    assert (gen.finish_reason, gen.stop_string) == ("stop", "</answer>")
    assert (gen.prompt_tokens, gen.cached_prompt_tokens) == (7, 4)


def test_regex_is_sent_as_vllm_structured_outputs_and_no_key_means_no_auth(server, monkeypatch):
    engine = make_engine(server, monkeypatch, api_key_env="RAYPIPE_TEST_UNSET_KEY")
    monkeypatch.delenv("RAYPIPE_TEST_UNSET_KEY", raising=False)
    run(engine, GenerationRequest(prompt="p", max_tokens=4, regex="<answer>[a-z]+</answer>"))
    _, headers, body = server.requests[0]
    assert "Authorization" not in headers
    assert body["structured_outputs"] == {"regex": "<answer>[a-z]+</answer>"}
    assert "stop" not in body and "logprobs" not in body


def test_length_finish_and_unknown_stop_reason(server, monkeypatch):
    server.script = [
        (200, {"choices": [{"text": "abc", "finish_reason": "length"}]}, 0.0),
        (200, {"choices": [{"text": "abc", "finish_reason": "stop", "stop_reason": 2}]}, 0.0),
    ]
    first = run(make_engine(server, monkeypatch), REQUEST)
    assert (first.finish_reason, first.stop_string, first.cached_prompt_tokens) == ("length", None, None)
    second = run(make_engine(server, monkeypatch), REQUEST)
    assert (second.finish_reason, second.stop_string) == ("stop", None)  # EOS / stop token: no stop string


def test_transient_failures_are_retried(server, monkeypatch):
    server.script = [(503, "busy", 0.0), (429, "slow down", 0.0)]
    gen = run(make_engine(server, monkeypatch), REQUEST)
    assert gen.text == " Paris" and len(server.requests) == 3


def test_gives_up_after_the_retries(server, monkeypatch):
    server.script = [(500, "boom", 0.0)] * 3
    with pytest.raises(EngineUnavailableError, match="after 3 attempts.*HTTP 500"):  # an outage
        run(make_engine(server, monkeypatch), REQUEST)
    assert len(server.requests) == 3


def test_timeout_is_retried(server, monkeypatch):
    server.script = [(200, OK_BODY, 1.0)]
    gen = run(make_engine(server, monkeypatch, request_timeout_s=0.2), REQUEST)
    assert gen.text == " Paris" and len(server.requests) == 2


@pytest.mark.parametrize(
    "status, reply, error, message",
    [
        (
            400,
            {"error": {"message": "This model's maximum context length is 2048 tokens"}},
            ContextOverflowError,
            "maximum context length",
        ),
        (400, {"error": "n must be at least 1"}, EngineError, "HTTP 400"),  # the request refused: its own
        (422, {"error": "bad field"}, EngineError, "HTTP 422"),
        (401, {"error": "bad key"}, EngineUnavailableError, "HTTP 401"),  # the server's setup: an outage
        (404, {"error": "no such model"}, EngineUnavailableError, "HTTP 404"),
        (200, "not json", EngineUnavailableError, "not JSON"),
        (200, {"choices": []}, EngineUnavailableError, "malformed"),
    ],
)
def test_failures_become_engine_errors_without_retry(server, monkeypatch, status, reply, error, message):
    """A request the server refuses is an EngineError (the row's internal_error, kept by a rerun); a server
    that cannot serve the run, an EngineUnavailableError (engine_error, an outage a rerun retries)."""
    server.script = [(status, reply, 0.0)]
    with pytest.raises(error, match=message) as raised:
        run(make_engine(server, monkeypatch), REQUEST)
    assert isinstance(raised.value, EngineUnavailableError) == (error is EngineUnavailableError)
    assert len(server.requests) == 1


def test_unreachable_server(monkeypatch):
    engine = OpenAIEngine(
        EngineConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", max_retries=1), backoff_s=0.01
    )
    with pytest.raises(EngineUnavailableError, match="after 2 attempts"):
        run(engine, REQUEST)
