"""Coalescing concurrent searches into batched calls: what a retrieval replica runs in front of FAISS.

A :class:`QueryBatcher` can also be *claimed* for one search alone (:meth:`QueryBatcher.claim`, then
:meth:`QueryBatcher.search_alone`): the retrieval client sends a query that was in flight at several replica
deaths that way (``retrieval.actors.max_query_crashes``, :mod:`raypipe.runtime.retrieval`), so that if the replica
dies again, nothing but that query ran on it. While a claim holds the batcher, ``search(...,
refuse_when_claimed=True)`` (the client's path) raises :class:`ReplicaBusy` at once and a plain ``search``
waits for the claim to end; the claim itself first waits for the batches already queued or running.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from raypipe.retrieval.types import SearchResult

SearchFn = Callable[[list[str], int], list[SearchResult]]


class ReplicaBusy(RuntimeError):
    """The replica refused a search: it is held for a search alone. Nothing ran; send it elsewhere or later."""


class ClaimLost(RuntimeError):
    """A search alone came with a claim this replica does not hold (it restarted, or the claim lapsed)."""


@dataclass
class _Request:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class QueryBatcher:
    """Coalesces concurrent ``search`` calls into batched calls of a blocking ``search_fn``.

    A drain task waits up to ``max_wait_s`` for a batch to fill (or until ``max_batch_size`` queries
    are queued), then runs batches of at most ``max_batch_size`` queries (a bigger single request is
    not split) until the queue is empty; requests that arrive during a search form the next batch.
    Requests with different ``k`` are searched separately. ``search_fn`` runs on one worker thread,
    so the event loop keeps accepting requests meanwhile.

    ``claim_hold_s``: how long a granted claim waits for its :meth:`search_alone` before it lapses (a
    client that died after claiming does not hold the replica longer).
    """

    def __init__(
        self, search_fn: SearchFn, max_batch_size: int = 64, max_wait_s: float = 0.005, claim_hold_s: float = 10.0
    ):
        self.search_fn = search_fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.claim_hold_s = claim_hold_s
        self._pending: list[_Request] = []
        self._queued = 0
        self._full: asyncio.Event | None = None
        self._drainer: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self._claim: str | None = None  # the claim holding the batcher for a search alone
        self._claim_ends = 0.0  # when it lapses (monotonic; inf while it waits for the batches before it)
        self._claim_lock: asyncio.Lock | None = None  # claims are granted one at a time, in order
        self._released: asyncio.Event | None = None  # set while no claim holds the batcher
        self.batches = 0  # search_fn calls made for coalesced requests (for tests and stats)
        self.alone = 0  # searches run alone under a claim
        self.refused = 0  # requests refused while claimed

    async def search(self, queries: Sequence[str], k: int, refuse_when_claimed: bool = False) -> list[SearchResult]:
        """The results of ``queries``, searched with whatever other requests are waiting. While a claim holds
        the batcher: raise :class:`ReplicaBusy` (``refuse_when_claimed``), else wait until it ends."""
        while self.claimed:
            if refuse_when_claimed:
                self.refused += 1
                raise ReplicaBusy("the retrieval replica is held for a search alone")
            await self._wait_released()
        loop = asyncio.get_running_loop()
        if self._full is None:
            self._full = asyncio.Event()
        request = _Request(list(queries), k, loop.create_future())
        self._pending.append(request)
        self._queued += len(request.queries)
        if self._queued >= self.max_batch_size:
            self._full.set()
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await request.future

    @property
    def claimed(self) -> bool:
        return self._claim is not None and time.monotonic() < self._claim_ends

    async def claim(self) -> str:
        """Hold the batcher for one :meth:`search_alone`; returns its claim once nothing else runs.

        Waits for an earlier claim to end, then refuses or holds back new requests and waits until the
        batches already queued or running are done."""
        if self._claim_lock is None:
            self._claim_lock = asyncio.Lock()
        async with self._claim_lock:
            while self.claimed:
                await self._wait_released()
            self._claim, self._claim_ends = uuid.uuid4().hex, float("inf")
            self._released_event().clear()
            try:
                while self._drainer is not None:
                    await asyncio.wait([self._drainer])
            except BaseException:  # cancelled while waiting: hold nothing
                self._release()
                raise
            self._claim_ends = time.monotonic() + self.claim_hold_s
            return self._claim

    async def search_alone(self, claim: str, queries: Sequence[str], k: int) -> list[SearchResult]:
        """Search ``queries`` by themselves under ``claim`` (from :meth:`claim`), then release it."""
        if claim != self._claim or not self.claimed:
            raise ClaimLost("this retrieval replica holds no such claim (it restarted, or the claim lapsed)")
        self._claim_ends = float("inf")  # no lapse while it runs
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.search_fn, list(queries), k)
        finally:
            self._release()
        self.alone += 1
        return results

    def _release(self) -> None:
        self._claim = None
        self._released_event().set()

    def _released_event(self) -> asyncio.Event:
        if self._released is None:
            self._released = asyncio.Event()
            self._released.set()
        return self._released

    async def _wait_released(self) -> None:
        """Until the claim ends (its search is done, or it lapsed)."""
        left = self._claim_ends - time.monotonic()
        if left == float("inf"):
            await self._released_event().wait()
        elif left > 0:
            try:
                await asyncio.wait_for(self._released_event().wait(), left)
            except TimeoutError:
                pass

    async def _drain(self) -> None:
        try:
            if self._queued < self.max_batch_size and self.max_wait_s > 0:
                try:
                    await asyncio.wait_for(self._full.wait(), self.max_wait_s)
                except TimeoutError:
                    pass
            while self._pending:
                await self._run(self._take())
        finally:
            self._drainer = None

    def _take(self) -> list[_Request]:
        """Requests from the head of the queue worth at most ``max_batch_size`` queries (at least one)."""
        count, taken = 0, 0
        for request in self._pending:
            if taken and count + len(request.queries) > self.max_batch_size:
                break
            count += len(request.queries)
            taken += 1
        batch, self._pending = self._pending[:taken], self._pending[taken:]
        self._queued -= count
        if self._queued < self.max_batch_size:
            self._full.clear()
        return batch

    async def _run(self, requests: list[_Request]) -> None:
        by_k: dict[int, list[_Request]] = {}
        for request in requests:
            by_k.setdefault(request.k, []).append(request)
        loop = asyncio.get_running_loop()
        for k, group in by_k.items():
            queries = [q for r in group for q in r.queries]
            try:
                results = await loop.run_in_executor(self._executor, self.search_fn, queries, k)
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for r in group:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            finally:
                self.batches += 1
            offset = 0
            for r in group:
                if not r.future.done():
                    r.future.set_result(results[offset : offset + len(r.queries)])
                offset += len(r.queries)
