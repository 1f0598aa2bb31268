"""A query that kills retrieval replicas is searched alone, then fails by itself (issue 22).

Without processes: the replica's claim (``QueryBatcher.claim`` / ``search_alone``) and the client's counts
(``RetrievalClient``) over scripted actor handles whose replica "dies" (Ray's ``ActorDiedError``) whenever
a call holds the poison query. The same with real replica processes and real exits is
``test_a_query_that_kills_its_replica_every_time_ends_query_crash`` in tests/test_chaos.py.
"""

import asyncio
import threading
import time

import pytest

from raypipe.retrieval.batcher import ClaimLost, QueryBatcher, ReplicaBusy
from raypipe.retrieval.types import SearchHit, SearchResult

POISON = "poison"


def result(query: str, k: int) -> SearchResult:
    return SearchResult(query, [SearchHit(f"{query}-{i}", 1.0 / (i + 1), query, "") for i in range(k)])


class SlowSearch:
    """A blocking search_fn that records each call and how many ran at once."""

    def __init__(self, seconds: float = 0.05):
        self.seconds, self.calls, self.running, self.most = seconds, [], 0, 0
        self._lock = threading.Lock()

    def __call__(self, queries, k):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.calls.append(list(queries))
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        return [result(q, k) for q in queries]


def test_a_claim_waits_for_the_running_batch_then_nothing_else_runs_beside_its_search():
    search = SlowSearch()
    batcher = QueryBatcher(search, max_batch_size=8, max_wait_s=0.01)

    async def main():
        first = asyncio.ensure_future(batcher.search(["a", "b"], 2))
        await asyncio.sleep(0.02)  # the batch is running
        claim = await batcher.claim()
        assert first.done(), "the claim is granted only once the queued and running batches are done"
        with pytest.raises(ReplicaBusy):
            await batcher.search(["c"], 2, refuse_when_claimed=True)
        held = asyncio.ensure_future(batcher.search(["d"], 2))  # a plain search waits for the claim
        await asyncio.sleep(0.05)
        assert not held.done() and search.calls == [["a", "b"]]
        alone = await batcher.search_alone(claim, ["x"], 2)
        with pytest.raises(ClaimLost):  # a claim serves one search
            await batcher.search_alone(claim, ["x"], 2)
        return await first, alone, await held

    first, alone, held = asyncio.run(main())
    assert (
        [r.query for r in first] == ["a", "b"]
        and [r.query for r in alone] == ["x"]
        and [r.query for r in held] == ["d"]
    )
    assert search.calls == [["a", "b"], ["x"], ["d"]] and search.most == 1
    assert (batcher.batches, batcher.alone, batcher.refused) == (2, 1, 1)


def test_claims_are_granted_one_at_a_time_and_a_lapsed_claim_frees_the_replica():
    batcher = QueryBatcher(SlowSearch(0.01), max_wait_s=0.0, claim_hold_s=0.1)

    async def main():
        first = await batcher.claim()
        second = asyncio.ensure_future(batcher.claim())
        await asyncio.sleep(0.02)
        assert not second.done()  # waits for the first claim's search
        await batcher.search_alone(first, ["x"], 1)
        other = await second
        # its client never sends the search: the claim lapses and plain searches go on
        answered = await asyncio.wait_for(batcher.search(["y"], 1), 1.0)
        with pytest.raises(ClaimLost):
            await batcher.search_alone(other, ["z"], 1)
        return answered

    assert [r.query for r in asyncio.run(main())] == ["y"]


# ---------------------------------------------------------------- the client over scripted replicas


class FakeReplica:
    """A replica handle as :class:`RetrievalClient` calls it (``handle.method.options(...).remote(...)``),
    over a real :class:`QueryBatcher`. A search call holding the poison "kills the process": every call in
    flight on it fails with Ray's ``ActorDiedError`` and the replica comes back with an empty batcher."""

    def __init__(self, name: str, log: list, max_wait_s: float = 0.02):
        self.name, self.log, self.max_wait_s = name, log, max_wait_s
        self.deaths, self.sends = 0, []
        self._start()

    def _start(self) -> None:
        self.batcher = QueryBatcher(self._search, max_batch_size=64, max_wait_s=self.max_wait_s)
        self.died = asyncio.Event()

    def _search(self, queries, k):
        self.log.append((self.name, list(queries)))
        if POISON in queries:
            self.loop.call_soon_threadsafe(self._die)
            raise RuntimeError("the process is gone")
        return [result(q, k) for q in queries]

    def _die(self) -> None:
        self.deaths += 1
        self.died.set()
        self._start()

    def __getattr__(self, method):
        return _Method(self, method)

    async def call(self, method: str, *args):
        from ray.exceptions import ActorDiedError

        self.loop = asyncio.get_running_loop()
        self.sends.append(method)
        died = self.died
        work = asyncio.ensure_future(getattr(self.batcher, method)(*args))
        death = asyncio.ensure_future(died.wait())
        await asyncio.wait([work, death], return_when=asyncio.FIRST_COMPLETED)
        if died.is_set():
            work.cancel()
            raise ActorDiedError()
        death.cancel()
        return work.result()


class _Method:
    def __init__(self, replica: FakeReplica, name: str):
        self.replica, self.name = replica, name

    def options(self, **options):
        assert options == {"max_task_retries": 0}, "the client's sends are never retried by Ray"
        return self

    def remote(self, *args):
        method = "search" if self.name == "try_search" else self.name
        if self.name == "try_search":
            args = (*args, True)  # refuse_when_claimed, as RetrievalActor.try_search
        return self.replica.call(method, *args)


def client_over(replicas: int, retries: int = 3):
    from raypipe.runtime.retrieval import RetrievalClient

    log: list = []
    actors = [FakeReplica(f"r{i}", log) for i in range(replicas)]
    return RetrievalClient(actors, "index", max_task_retries=retries, max_query_crashes=2), actors, log


INNOCENT = [f"q{i}" for i in range(5)]


async def search_all(client, queries):
    async def one(query):
        try:
            return (await client.search([query], 3))[0]
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            return exc

    return await asyncio.gather(*(one(q) for q in queries))


def test_normal_searches_take_one_send_each():
    client, actors, log = client_over(2)
    got = asyncio.run(search_all(client, INNOCENT))
    assert [r.query for r in got] == INNOCENT
    assert sorted(s for a in actors for s in a.sends) == ["search"] * len(INNOCENT)  # no claim, no resend
    assert not client._deaths


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_poison_query_fails_alone_after_bounded_deaths_and_the_others_are_answered(replicas):
    from raypipe.runtime.retrieval import QueryCrashError

    client, actors, log = client_over(replicas)
    queries = [*INNOCENT[:2], POISON, *INNOCENT[2:]]
    sends = {}

    async def main():  # one event loop, as in a generation actor
        got = await search_all(client, queries)
        sends["before"] = sum(len(a.sends) for a in actors)
        return got, await search_all(client, [POISON, "later"])

    got, again = asyncio.run(main())
    poisoned = got[queries.index(POISON)]
    assert isinstance(poisoned, QueryCrashError), poisoned
    assert "in flight at 3 retrieval replica deaths, the last one alone" in str(poisoned)
    assert "ActorDiedError" in str(poisoned)
    for query, answer in zip(queries, got):
        if query != POISON:
            assert isinstance(answer, SearchResult) and answer == result(query, 3), answer
    assert sum(a.deaths for a in actors) == 3  # max_query_crashes + 1
    with_poison = [qs for _, qs in log if POISON in qs]
    assert len(with_poison) == 3 and with_poison[-1] == [POISON]
    assert len(with_poison[0]) > 1, "the poison never shared a batch: nothing was isolated"
    assert list(client._deaths) == [POISON]  # the others' counts end with their success
    # the client does not send it again
    assert isinstance(again[0], QueryCrashError) and again[1] == result("later", 3)
    assert sum(len(a.sends) for a in actors) == sends["before"] + 1 and sum(a.deaths for a in actors) == 3


def test_with_retries_off_the_poison_fails_its_batch_at_the_first_death():
    from ray.exceptions import ActorDiedError

    client, actors, log = client_over(1, retries=0)
    queries = [*INNOCENT[:2], POISON, *INNOCENT[2:]]
    got = asyncio.run(search_all(client, queries))
    assert actors[0].deaths == 1
    assert all(isinstance(answer, ActorDiedError) for answer in got)  # one batch: all in flight at the death
    assert actors[0].sends == ["search"] * len(queries)
