"""Coalescing concurrent searches into batched calls: what a retrieval replica runs in front of FAISS."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from raypipe.retrieval.types import SearchResult

SearchFn = Callable[[list[str], int], list[SearchResult]]


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
    """

    def __init__(self, search_fn: SearchFn, max_batch_size: int = 64, max_wait_s: float = 0.005):
        self.search_fn = search_fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._pending: list[_Request] = []
        self._queued = 0
        self._full: asyncio.Event | None = None
        self._drainer: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="search")
        self.batches = 0  # search_fn calls made (for tests and stats)

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
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

    async def _drain(self) -> None:
        try:
            if self._queued < self.max_batch_size and self.max_wait_s > 0:
                try:
                    await asyncio.wait_for(self._full.wait(), self.max_wait_s)
                except asyncio.TimeoutError:
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
