"""The HTTP retrieval client against servers that misbehave (raypipe.testing.http_faults): a deadline for the
whole answer, a ceiling on its size, every malformed answer a one-line RetrievalServerError, retries of what
passes (a hang-up, 408, 5xx) and none of what would repeat, and the bearer token."""

from __future__ import annotations

import json
import time

import pytest

from raypipe.core.config import load_config
from raypipe.core.http import TOKEN_ENV
from raypipe.retrieval.http_client import HttpRetriever, RetrievalResponseError, RetrievalServerError
from raypipe.testing.http_faults import FaultyServer, Received, Reply, json_reply, search_r1_answer


@pytest.fixture
def serve():
    servers = []

    def start(script) -> FaultyServer:
        servers.append(FaultyServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def fails(call, *args, error=RetrievalServerError) -> str:
    """The message of the error ``call`` raises: of ``error``'s type, on one line."""
    with pytest.raises(error) as raised:
        call(*args)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


def test_a_health_answer_that_is_not_an_object_is_a_clear_error(serve):
    """A /health answering a JSON list used to raise TypeError (a traceback for the user)."""
    for body in (b"[1, 2]", b'"ok"', b"<html>\n<body>busy</body>\n</html>"):
        server = serve(lambda _request, body=body: Reply(body=body))
        message = fails(HttpRetriever(server.url, retries=0).describe, error=RetrievalResponseError)
        assert f"GET {server.url}/health" in message
        assert ("expected a JSON object" in message) if body.startswith((b"[", b'"')) else ("not JSON" in message)


@pytest.mark.parametrize(
    "answer, message",
    [
        ([["a"]], '/retrieve: expected a JSON object, got [["a"]]'),
        ({"result": "everything"}, "expected an object with a 'result' list"),
        ({"result": [[], []]}, "1 queries sent, 2 result lists received"),
        ({"result": [5]}, "expected a list of hits"),
        ({"result": [["doc"]]}, "expected {'document'"),
        ({"result": [[{"document": {"id": "d"}, "score": 1.0}]]}, "needs an 'id' and a 'contents'"),
        ({"result": [[{"document": {"id": "d", "contents": "c"}, "score": "high"}]]}, "without a numeric score"),
        ({"result": [[{"document": {"id": ["d"], "contents": "c"}, "score": 1.0}]]}, "needs an 'id' and a 'contents'"),
    ],
)
def test_every_malformed_search_answer_is_a_one_line_error_and_not_retried(serve, answer, message):
    server = serve(lambda _request: json_reply(answer))
    client = HttpRetriever(server.url, retries=3, backoff_s=0)
    assert message in fails(client.search_batch, ["q"], 3, error=RetrievalResponseError)
    assert len(server.requests) == 1


def test_the_deadline_covers_the_whole_answer_not_each_read(serve):
    """A server that sends its answer a byte every 20 ms (6 s in all): each read is quick, the answer is not."""
    server = serve(lambda request: json_reply(search_r1_answer(request), drip_s=0.02))
    client = HttpRetriever(server.url, timeout_s=0.5, retries=1, backoff_s=0.05)
    started = time.perf_counter()
    message = fails(client.search_batch, ["q"], 2)
    assert "failed 2 time(s); last: TimeoutError" in message and "within 0.5 s" in message
    assert time.perf_counter() - started < 2.0  # two tries of 0.5 s and a backoff, not 2 x 6 s
    assert len(server.requests) == 2


def test_an_answer_over_the_size_limit_fails_without_being_read_whole(serve):
    def big(request: Received) -> Reply:
        answer = search_r1_answer(request)
        answer["padding"] = "x" * 300_000
        return json_reply(answer, sized=request.body["queries"][0] == "sized")

    server = serve(big)
    client = HttpRetriever(server.url, retries=3, backoff_s=0, max_response_bytes=200_000)
    assert "an answer of 300," in fails(client.search_batch, ["sized"], 2, error=RetrievalResponseError)
    assert "over the limit of 200,000 bytes" in fails(client.search_batch, ["unsized"], 2, error=RetrievalResponseError)
    assert len(server.requests) == 2  # neither retried: the server would send the same
    roomy = HttpRetriever(server.url, max_response_bytes=400_000)
    assert roomy.search_batch(["sized"], 2)[0].hits[1].doc_id == "sized-1"


def test_hang_ups_and_408_are_retried_other_4xx_are_not(serve):
    replies = iter([Reply(hang_up=True), Reply(408, b'{"detail": "slow"}'), None, Reply(413, b"{}")])

    def script(request: Received) -> Reply:
        reply = next(replies)
        return reply if reply is not None else json_reply(search_r1_answer(request))

    server = serve(script)
    client = HttpRetriever(server.url, retries=2, backoff_s=0)
    assert client.search_batch(["q"], 1)[0].hits[0].doc_id == "q-0"
    assert len(server.requests) == 3
    assert "HTTP 413" in fails(client.search_batch, ["q"], 1)
    assert len(server.requests) == 4


def test_a_408_from_serves_proxy_is_retried_and_each_try_has_its_own_deadline(serve):
    """What docs/retrieval.md says: a 408 (here Serve's proxy's, plain text) is retried, and the deadline
    (retrieval.http.timeout_s) is per HTTP call: two tries of 0.35 s each succeed under a 0.5 s deadline."""
    replies = iter([Reply(408, b"Request 1a2b timed out after 60.0s.", delay_s=0.35), None])

    def script(request: Received) -> Reply:
        reply = next(replies)
        return reply if reply is not None else json_reply(search_r1_answer(request), delay_s=0.35)

    server = serve(script)
    client = HttpRetriever(server.url, timeout_s=0.5, retries=1, backoff_s=0)
    started = time.perf_counter()
    assert client.search_batch(["q"], 1)[0].hits[0].doc_id == "q-0"
    assert time.perf_counter() - started > 0.5 and len(server.requests) == 2


def test_the_token_goes_with_every_request(serve, monkeypatch):
    server = serve(lambda request: json_reply(search_r1_answer(request) if request.body else {"status": "ok"}))
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    HttpRetriever(server.url).search_batch(["q"], 1)
    HttpRetriever(server.url, token="given").describe()
    monkeypatch.delenv(TOKEN_ENV)
    HttpRetriever(server.url).search_batch(["q"], 1)
    sent = [r.headers.get("authorization") for r in server.requests]
    assert sent == ["Bearer from-the-environment", "Bearer given", None]
    assert json.dumps(HttpRetriever(server.url, token="given").describe()).count("given") == 0  # not in the run's info


def test_a_refused_token_names_the_variable_and_is_not_retried(serve):
    server = serve(lambda _request: Reply(status=401, body=b'{"detail": "this server wants a token"}'))
    message = fails(HttpRetriever(server.url, retries=3, backoff_s=0).search_batch, ["q"], 1)
    assert "HTTP 401" in message and TOKEN_ENV in message and len(server.requests) == 1


def test_the_size_limit_and_deadline_come_from_the_config():
    cfg = load_config(
        "embedded",
        [
            "retrieval.backend=http",
            "retrieval.http.url=http://h:1",
            "retrieval.http.max_response_bytes=5000",
            "retrieval.http.timeout_s=2",
        ],
    ).retrieval
    client = HttpRetriever.from_config(cfg)
    assert (client.max_response_bytes, client.timeout_s) == (5000, 2.0)


def test_the_features_corpus_calls_go_through_the_client(serve):
    """HttpTransport (the features stage over `retrieval.backend=http`) sends the token and gets the client's
    checks: a missing endpoint says the server is not raypipe's; a malformed answer is one line."""
    from raypipe.runtime.corpus_service import CorpusServiceError, HttpTransport

    info = {"n_docs": 2, "dimension": 3, "passages": 2, "encoder": {}}
    server = serve(lambda request: json_reply(info) if request.path.endswith("corpus_info") else Reply(status=404))
    transport = HttpTransport(HttpRetriever(server.url, token="secret", retries=0))
    assert transport.corpus_info() == info
    assert server.requests[0].headers.get("authorization") == "Bearer secret"
    assert "not raypipe's retrieval deployment" in fails(transport.doc_vectors, ["d1"], error=CorpusServiceError)

    garbage = serve(lambda _request: Reply(body=b"[1, 2]"))
    message = fails(HttpTransport(HttpRetriever(garbage.url, retries=0)).corpus_info, error=CorpusServiceError)
    assert "JSON object" in message or "object" in message
