"""What one request may take of the retrieval service, without Ray: the limits and their messages, the token
and body-size gate in front of the routes, a failing search group that fails only its own callers, and
FAISS never asked for more than the passages indexed. The deployment itself: tests/test_serve.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient

from raypipe.core.config import ServeConfig, load_config
from raypipe.data.loaders import BUNDLED_CORPUS
from raypipe.retrieval import LocalRetriever, encoder_spec
from raypipe.retrieval.types import SearchHit, SearchResult
from raypipe.runtime.serve import (
    RequestError,
    RequestGate,
    check_items,
    check_queries,
    check_results,
    search_by_topk,
    search_depth,
)

LIMITS = ServeConfig(max_queries=4, max_topk=50, max_items=8, timeout_s=5.0, max_results=120, max_batch_results=40)


def refusal(call, *args) -> RequestError:
    with pytest.raises(RequestError) as refused:
        call(*args)
    return refused.value


def test_the_limits_refuse_with_a_4xx_that_names_the_setting():
    check_queries(LIMITS, 4)
    too_many = refusal(check_queries, LIMITS, 100_000)
    assert too_many.status == 413 and "100000 queries" in too_many.detail
    assert "retrieval.serve.max_queries" in too_many.detail
    check_items(LIMITS, "terms", 8)
    items = refusal(check_items, LIMITS, "terms", 9)
    assert items.status == 413 and "9 terms" in items.detail and "retrieval.serve.max_items" in items.detail
    for topk in (10**12, 51, 0):
        deep = refusal(search_depth, LIMITS, topk, 40)
        assert deep.status == 422 and f"topk {topk}" in deep.detail and "retrieval.serve.max_topk" in deep.detail


def test_topk_is_clamped_to_the_passages_indexed():
    assert search_depth(LIMITS, 3, 40) == 3
    assert search_depth(LIMITS, 50, 40) == 40  # more than the corpus holds: all of it, FAISS asked for 40
    assert search_depth(LIMITS, 50, 0) == 1


def test_limits_come_from_the_retrieval_section():
    cfg = load_config("embedded", ["retrieval.serve.max_queries=7", "retrieval.serve.timeout_s=2.5"]).retrieval
    assert (cfg.serve.max_queries, cfg.serve.timeout_s, cfg.serve.max_topk) == (7, 2.5, 1024)
    defaults = load_config("embedded").retrieval
    assert defaults.serve.max_topk >= defaults.deep_k  # the agents' deep list fits the default


def gated_app(token: str | None, max_bytes: int = 1000) -> tuple[TestClient, list[int]]:
    """A route that echoes the size of the body it got, behind the gate; the list counts the calls that passed."""
    app, passed = FastAPI(), []

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        body = await request.body()
        passed.append(len(body))
        return {"bytes": len(body)}

    @app.get("/health")
    async def health() -> dict:
        passed.append(0)
        return {"status": "ok"}

    app.add_middleware(RequestGate, settings=lambda: (token, max_bytes))
    return TestClient(app), passed


def test_the_gate_wants_the_token_and_compares_it_whole():
    client, passed = gated_app("s3cret")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer s3cret-and-more"},
        {"Authorization": "s3cret"},
    ):
        answer = client.get("/health", headers=headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer TOKEN" in answer.json()["detail"]
    assert passed == []
    assert client.get("/health", headers={"Authorization": "Bearer s3cret"}).json() == {"status": "ok"}
    assert client.post("/echo", content=b"{}", headers={"Authorization": "Bearer s3cret"}).json() == {"bytes": 2}
    open_client, _ = gated_app(None)
    assert open_client.get("/health").status_code == 200  # no token set: no authentication


def test_the_gate_refuses_a_body_over_the_limit_before_the_route_reads_it():
    client, passed = gated_app(None, max_bytes=1000)
    assert client.post("/echo", content=b"x" * 1000).json() == {"bytes": 1000}  # at the limit: passed on whole
    declared = client.post("/echo", content=b"x" * 1001)
    assert declared.status_code == 413 and "retrieval.serve.max_body_bytes" in declared.json()["detail"]

    def chunks():  # no Content-Length: counted while read
        for _ in range(40):
            yield b"y" * 100

    streamed = client.post("/echo", content=chunks())
    assert streamed.status_code == 413 and "1,000 bytes" in streamed.json()["detail"]
    assert passed == [1000]


def results_for(queries: list[str], k: int) -> list[SearchResult]:
    return [SearchResult(q, [SearchHit(f"{q}-{i}", 1.0, "t", "x") for i in range(k)]) for q in queries]


def test_a_failing_search_group_fails_only_its_own_callers():
    def search(queries: list[str], k: int) -> list[SearchResult]:
        if k == 7:
            raise MemoryError("k=7 went wrong")
        return results_for(queries, k)

    calls = [(["a", "b"], 3), (["c"], 7), (["d"], 3), (["e", "f"], 7), (["g"], 2)]
    out = asyncio.run(search_by_topk(calls, search))
    assert isinstance(out[1], MemoryError) and out[3] is out[1]
    firsts = [[h.doc_id for r in o for h in r.hits[:1]] for o in (out[0], out[2], out[4])]
    assert firsts == [["a-0", "b-0"], ["d-0"], ["g-0"]]
    assert [len(o[0].hits) for o in (out[0], out[2], out[4])] == [3, 3, 2]


def test_faiss_is_never_asked_for_more_than_the_passages_indexed(tmp_path):
    from raypipe.runtime.index_build import ensure_index

    corpus = tmp_path / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(12)))
    config = load_config("embedded", [f"data.corpus={corpus}", f"retrieval.index.dir={tmp_path / 'idx'}"])
    ensure_index(config, use_ray=False)
    retriever = LocalRetriever.open(tmp_path / "idx", encoder_spec(config.retrieval))
    asked: list[int] = []
    index = retriever.index

    class Recording:
        ntotal = index.ntotal

        def search(self, vectors, k):
            asked.append(k)
            return index.search(vectors, k)

    retriever.index = Recording()
    [result] = retriever.search_batch(["film director"], 10**12)
    assert asked == [12] and len(result.hits) == 12
    retriever.search_batch(["film director"], 5)
    assert asked == [12, 5]


class SlowCorpus:
    """Corpus answers that block their thread for ``seconds`` (a big document-frequency call)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def _slow(self, answer):
        time.sleep(self.seconds)
        return answer

    def corpus_info(self):
        return self._slow({"n_docs": 1})

    def doc_vectors(self, doc_ids):
        return self._slow([[0.0]] * len(doc_ids))

    def document_frequencies(self, terms, lexicon):
        return self._slow([1] * len(terms))

    def encode_queries(self, texts):
        return self._slow([[0.0]] * len(texts))


def replica(corpus, limits: ServeConfig = LIMITS):
    """A deployment replica's object without Serve or an index: only its limits and corpus answers."""
    from raypipe.runtime.serve import RetrievalDeployment

    class Replica(RetrievalDeployment.func_or_class):
        def __del__(self):  # Serve's wrapper shuts its ASGI app down here; this one never started it
            pass

    obj = object.__new__(Replica)
    obj.limits, obj.corpus = limits, corpus
    return obj


async def ticks_while(work, period: float = 0.01) -> tuple[object, int]:
    """``work``'s result and how often the event loop ran another task meanwhile."""
    count, done = 0, asyncio.Event()

    async def ticker():
        nonlocal count
        while not done.is_set():
            await asyncio.sleep(period)
            count += 1

    task = asyncio.create_task(ticker())
    try:
        return await work, count
    finally:
        done.set()
        await task


def test_corpus_calls_run_off_the_event_loop_within_the_limits_and_the_deadline():
    slow = replica(SlowCorpus(0.4))
    for call in (
        slow.corpus_info(),
        slow.doc_vectors(["a"]),
        slow.document_frequencies(["a", "b"]),
        slow.encode_queries(["q"]),
    ):
        answer, ticks = asyncio.run(ticks_while(call))
        assert answer and ticks >= 10, (answer, ticks)  # the loop went on serving during the 0.4 s
    refused = refusal(lambda: asyncio.run(slow.document_frequencies([f"t{i}" for i in range(9)])))
    assert refused.status == 413 and "9 terms" in refused.detail
    late = replica(SlowCorpus(1.0), LIMITS.model_copy(update={"timeout_s": 0.1}))
    timed_out = refusal(lambda: asyncio.run(late.encode_queries(["q"])))
    assert timed_out.status == 408 and "retrieval.serve.timeout_s" in timed_out.detail


def test_the_deadline_gives_408():
    from raypipe.runtime.serve import within_deadline

    assert asyncio.run(within_deadline(asyncio.sleep(0, "done"), 1.0)) == "done"
    started = time.perf_counter()
    late = refusal(lambda: asyncio.run(within_deadline(asyncio.sleep(5), 0.05)))
    assert late.status == 408 and "within 0.05 s" in late.detail and time.perf_counter() - started < 1.0


def test_asyncios_timeout_is_the_builtin_one_the_deadline_catches():
    """The services catch the builtin TimeoutError for asyncio.wait_for's deadline: the same class from Python 3.11,
    the oldest the project declares (on 3.10 it was a class of its own, and a deadline became a 500)."""
    import tomllib
    from pathlib import Path

    assert asyncio.TimeoutError is TimeoutError
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["requires-python"].startswith(">=3.11")


def test_queries_times_topk_is_bounded_per_request_and_per_search_call():
    """1,024 queries x topk 1,024 in one request was allowed by default, and Serve's batching could merge 64 such:
    a request is refused past retrieval.serve.max_results hits, and merged requests are searched in calls of at most
    retrieval.serve.max_batch_results hits."""
    check_results(LIMITS, 4, 30)  # 120 hits: the limit
    over = refusal(check_results, LIMITS, 4, 31)
    assert over.status == 413 and "124 hits" in over.detail and "retrieval.serve.max_results" in over.detail
    defaults = load_config("embedded").retrieval
    default_limits = defaults.serve
    assert defaults.deep_k * defaults.actors.max_batch_size <= default_limits.max_results  # the agents' batches fit
    assert refusal(check_results, default_limits, 1024, 1024).status == 413
    assert default_limits.max_batch_results < defaults.actors.max_batch_size * default_limits.max_results

    sizes: list[int] = []

    def search(queries: list[str], k: int) -> list[SearchResult]:
        sizes.append(len(queries) * k)
        return results_for(queries, k)

    calls = [([f"q{i}-{j}" for j in range(4)], 10) for i in range(5)] + [(["x"], 3)]  # 200 hits at k=10, 3 at k=3
    out = asyncio.run(search_by_topk(calls, search, max_results=LIMITS.max_batch_results))
    assert max(sizes) <= LIMITS.max_batch_results and sum(sizes) == 203
    assert [[r.query for r in o] for o in out[:2]] == [[f"q0-{j}" for j in range(4)], [f"q1-{j}" for j in range(4)]]
    assert out[5][0].query == "x" and len(out[5][0].hits) == 3


def test_a_handle_search_has_its_deadline_from_the_call_its_queue_included():
    """retrieval.backend=serve: a search through the Serve handle that gets no answer within retrieval.serve.timeout_s
    (here it waits in Serve's queue) is cancelled and fails with a one-line RetrievalServerError."""
    from raypipe.retrieval.http_client import RetrievalServerError
    from raypipe.runtime.serve_client import ServeRetriever

    class Queued:  # a DeploymentResponse that never leaves Serve's queue
        cancelled = False

        def __await__(self):
            return asyncio.sleep(30).__await__()

        def cancel(self):
            Queued.cancelled = True

    class Handle:
        class search:
            @staticmethod
            def remote(queries, k):
                return Queued()

    retriever = object.__new__(ServeRetriever)
    retriever.handle, retriever.name, retriever.timeout_s = Handle(), "raypipe-retrieval", 0.1
    started = time.perf_counter()
    with pytest.raises(RetrievalServerError, match=r"within 0.1 s \(retrieval.serve.timeout_s\), its queue included"):
        asyncio.run(retriever.search(["q"], 3))
    assert time.perf_counter() - started < 2 and Queued.cancelled
