"""A job's client of the ``raypipe serve-retrieval`` deployment on its own Ray cluster (``retrieval.backend:
serve``): searches through a Serve handle, without HTTP. The deployment itself is :mod:`raypipe.runtime.serve`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ray import serve

from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.types import SearchResult


class ServeRetriever:
    """A :class:`~raypipe.retrieval.types.SharedRetrievalService` over the deployment ``name`` on the connected
    Ray cluster (a Serve handle). Picklable: generation actors call the replicas directly. Each search has the
    deadline ``timeout_s`` (``retrieval.serve.timeout_s``) from the call, Serve's queue included: past it the call
    is cancelled and :class:`RetrievalServerError` raised."""

    def __init__(self, name: str, timeout_s: float):
        try:
            self.handle = serve.get_app_handle(name)
        except Exception as exc:
            raise RetrievalServerError(
                f"no Ray Serve application {name!r} on this Ray cluster ({type(exc).__name__}: {exc}); start it with "
                "`raypipe serve-retrieval` and point ray.address at its cluster, or use retrieval.backend=http"
            ) from exc
        self.name, self.timeout_s = name, timeout_s

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        response = self.handle.search.remote(list(queries), k)

        async def answer() -> list[SearchResult]:
            return await response

        try:
            return await asyncio.wait_for(answer(), self.timeout_s)
        except TimeoutError:  # asyncio.TimeoutError is this builtin from Python 3.11
            response.cancel()
            raise RetrievalServerError(
                f"no answer from the Ray Serve application {self.name!r} within "
                f"{self.timeout_s:g} s (retrieval.serve.timeout_s), its queue included"
            ) from None

    def describe(self) -> dict[str, Any]:
        started = time.perf_counter()
        health = self.handle.health.remote().result(timeout_s=60)
        return {
            "backend": "serve",
            "deployment": self.name,
            "health": {**health, "seconds": round(time.perf_counter() - started, 3)},
        }

    def shutdown(self) -> None:
        """Nothing to stop: the deployment outlives the job."""
