"""The Search-R1 HTTP client against a small server (tests/helpers/search_r1_server.py): format, coalescing,
timeouts, retries, a server that dies mid-run, empty queries, and the response format the deployment sends."""

from __future__ import annotations

import asyncio
import json
import pickle
import time

import pyarrow as pa
import pytest

from raypipe.core.config import ConfigError, load_config
from raypipe.data.loaders import Question, split_contents
from raypipe.retrieval.http_client import (
    HttpRetriever,
    RetrievalResponseError,
    RetrievalServerError,
    base_url,
    parse_retrieve_response,
    retrieve_response,
)
from raypipe.retrieval.types import SearchHit, SearchResult
from raypipe.testing.fakes import FakeEngine
from tests.helpers.search_r1_server import SearchR1Server, documents_for


@pytest.fixture
def server_factory():
    servers = []

    def make(**kwargs) -> SearchR1Server:
        servers.append(SearchR1Server(**kwargs))
        return servers[-1]

    yield make
    for s in servers:
        if s.thread.is_alive():
            s.stop()


def test_request_and_response_follow_search_r1(server_factory):
    server = server_factory()
    results = HttpRetriever(server.url).search_batch(["who wrote Hamlet", "Paris"], 5)
    assert server.requests == [{"queries": ["who wrote Hamlet", "Paris"], "topk": 5, "return_scores": True}]
    assert [len(r.hits) for r in results] == [5, 5]
    first = results[0].hits[1]
    assert first == SearchHit(
        "who wrote Hamlet-1", 0.875, "Title 1 of who wrote Hamlet", "passage 1 about who wrote Hamlet"
    )
    assert (first.title, first.text) == split_contents(documents_for("who wrote Hamlet", 2)[1]["document"]["contents"])
    assert results[1].query == "Paris" and not results[1].empty_query


def test_contents_split_like_the_corpus_and_ids_as_strings():
    body = {
        "result": [
            [
                {"document": {"id": 7, "contents": "no title line"}, "score": 2},
                {"document": {"id": "a", "contents": '"Quoted" Title"\nline one\nline two'}, "score": 0.5},
            ]
        ]
    }
    hits = parse_retrieve_response(body, ["q"], 10)[0].hits
    assert [(h.doc_id, h.title, h.text, h.score) for h in hits] == [
        ("7", "no title line", "", 2.0),
        ("a", 'Quoted" Title', "line one\nline two", 0.5),
    ]
    assert len(parse_retrieve_response(body, ["q"], 1)[0].hits) == 1  # a server that ignores topk is cut to k


def test_response_format_round_trips_through_the_client():
    results = [
        SearchResult("q", [SearchHit("d1", 0.123456789012345, "A title", "its text\nmore")]),
        SearchResult("", [], True),
    ]
    body = json.loads(json.dumps(retrieve_response(results, return_scores=True)))
    assert body == {
        "result": [
            [{"document": {"id": "d1", "contents": '"A title"\nits text\nmore'}, "score": 0.123456789012345}],
            [],
        ]
    }
    assert parse_retrieve_response(body, ["q", ""], 5)[0].hits == results[0].hits  # same ids and exact scores
    assert retrieve_response(results, return_scores=False) == {
        "result": [[{"id": "d1", "contents": '"A title"\nits text\nmore'}], []]
    }


@pytest.mark.parametrize(
    "mode, message",
    [
        ("not_json", "not JSON"),
        ("no_result", "'result' list"),
        ("short", "2 queries sent, 1 result lists"),
        ("no_score", "expected {'document'"),
        ("bad_document", "needs an 'id' and a 'contents'"),
    ],
)
def test_malformed_responses_are_clear_errors_and_not_retried(server_factory, mode, message):
    server = server_factory(mode=mode)
    with pytest.raises(RetrievalResponseError, match=message):
        HttpRetriever(server.url, retries=3, backoff_s=0).search_batch(["a", "b"], 3)
    assert len(server.requests) == 1


def test_empty_queries_are_answered_without_a_request(server_factory):
    server = server_factory()
    client = HttpRetriever(server.url)
    results = client.search_batch(["", "  ", "real"], 3)
    assert [r.empty_query for r in results] == [True, True, False] and results[0].hits == []
    assert server.requests == [{"queries": ["real"], "topk": 3, "return_scores": True}]
    assert client.search_batch(["\n"], 3)[0].empty_query and len(server.requests) == 1


def test_slow_server_times_out_after_the_retries(server_factory):
    server = server_factory(mode="slow", delay_s=1.0)
    client = HttpRetriever(server.url, timeout_s=0.2, retries=1, backoff_s=0.05)
    started = time.perf_counter()
    with pytest.raises(RetrievalServerError, match=r"failed 2 time\(s\); last: TimeoutError"):
        client.search_batch(["q"], 2)
    assert time.perf_counter() - started < 1.0  # gave up on each try after the timeout, not the server's delay


def test_5xx_is_retried_4xx_is_not(server_factory):
    flaky = server_factory(mode="error500", fail_first=2)
    assert HttpRetriever(flaky.url, retries=2, backoff_s=0).search_batch(["q"], 1)[0].hits[0].doc_id == "q-0"
    assert len(flaky.requests) == 3
    refused = server_factory(mode="http400")
    with pytest.raises(RetrievalServerError, match="HTTP 400: .*bad topk"):
        HttpRetriever(refused.url, retries=3, backoff_s=0).search_batch(["q"], 1)
    assert len(refused.requests) == 1


def test_concurrent_searches_are_coalesced_into_batched_posts(server_factory):
    server = server_factory(mode="slow", delay_s=0.05)
    client = HttpRetriever(server.url, max_batch_size=16, max_wait_ms=20)

    async def many():
        return await asyncio.gather(*(client.search([f"q{i}"], 4) for i in range(40)))

    results = asyncio.run(many())
    assert [r[0].hits[0].doc_id for r in results] == [f"q{i}-0" for i in range(40)]
    sizes = [len(r["queries"]) for r in server.requests]
    assert sum(sizes) == 40 and max(sizes) <= 16 and len(sizes) <= 5  # 40 single-query calls, a few POSTs
    restored = pickle.loads(pickle.dumps(client))  # travels to generation actors; its batcher does not
    assert restored._batcher is None and restored.url == server.url


def test_health_without_a_health_endpoint_is_a_first_call(server_factory):
    server = server_factory()
    info = HttpRetriever(server.url + "/retrieve/").describe()
    assert info["url"] == server.url and info["backend"] == "http"
    assert info["health"]["endpoint"] == "POST /retrieve" and info["health"]["hits"] == 1
    server.stop()
    with pytest.raises(RetrievalServerError, match="/health"):
        HttpRetriever(server.url, retries=0).health()


def test_config_and_url_checks():
    with pytest.raises(ConfigError, match="needs retrieval.http.url"):
        HttpRetriever.from_config(load_config("embedded", ["retrieval.backend=http"]).retrieval)
    client = HttpRetriever.from_config(
        load_config(
            "embedded", ["retrieval.backend=http", "retrieval.http.url=http://h:1/", "retrieval.http.retries=5"]
        ).retrieval
    )
    assert (client.url, client.retries) == ("http://h:1", 5)
    with pytest.raises(ValueError, match="http://"):
        base_url("localhost:8000")


SEARCH = "<think> look </think>\n<search> {q} </search>"
ANSWER = "<think> done </think>\n<answer> answer {q} </answer>"


def search_then_answer(config):
    """Each question searches until it has read its first document, then answers."""

    def script(request):
        q = request.prompt.split("Question: ")[1].split("?")[0]
        if request.prompt.endswith("<answer>"):
            return f" answer {q} </answer>"
        return ANSWER.format(q=q) if "Doc 1(" in request.prompt else SEARCH.format(q=q)

    return FakeEngine(script)


def test_a_server_that_dies_mid_run_ends_rows_with_retrieval_error(server_factory):
    from raypipe.runtime.generation import question_items, split_output
    from raypipe.stages.probe import GenerateStage

    server = server_factory(mode="slow", delay_s=0.05, die_after=1)
    config = load_config(
        "embedded",
        [
            "retrieval.backend=http",
            f"retrieval.http.url={server.url}",
            "retrieval.http.retries=1",
            "retrieval.actors.max_batch_size=4",
            "retrieval.actors.max_wait_ms=20",
            "generation.max_concurrent_trajectories=12",
        ],
    )
    client = HttpRetriever.from_config(config.retrieval)
    client.backoff_s = 0.01
    stage = GenerateStage(config, client, engine_factory=search_then_answer)
    questions = [
        Question(qid=f"id{i}", dataset="toy", question=f"q{i}", golden_answers=[f"answer q{i}"]) for i in range(10)
    ]
    try:
        trajectories, iterations = split_output(stage(pa.Table.from_pylist(question_items(questions))))
    finally:
        stage.close()
    rows = {t["qid"]: t for t in trajectories.to_pylist()}
    assert sorted(rows) == sorted(q.qid for q in questions)  # rows out = questions in
    served = {q for r in server.requests for q in r["queries"]}
    assert 0 < len(served) < len(questions)
    for qid, row in rows.items():
        if f"q{qid[2:]}" in served:
            assert row["stop_reason"] == "answer" and row["final_f1"] == 1.0
        else:
            assert row["stop_reason"] == "retrieval_error"
            assert "failed 2 time(s)" in row["error"] and "/retrieve" in row["error"]
