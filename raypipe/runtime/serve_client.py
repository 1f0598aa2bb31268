"""A job's client of the ``raypipe serve-retrieval`` deployment on its own Ray cluster (``retrieval.backend:
serve``): searches through a Serve handle, without HTTP. The deployment itself is :mod:`raypipe.runtime.serve`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ray import serve

from raypipe.retrieval.http_client import RetrievalServerError
from raypipe.retrieval.types import SearchResult


class ServeRetriever:
    """A :class:`~raypipe.retrieval.types.SharedRetrievalService` over the deployment ``name`` on the connected
    Ray cluster (a Serve handle). Picklable: generation actors call the replicas directly."""

    def __init__(self, name: str):
        try:
            self.handle = serve.get_app_handle(name)
        except Exception as exc:
            raise RetrievalServerError(
                f"no Ray Serve application {name!r} on this Ray cluster ({type(exc).__name__}: {exc}); start it with "
                "`raypipe serve-retrieval` and point ray.address at its cluster, or use retrieval.backend=http"
            ) from exc
        self.name = name

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        return await self.handle.search.remote(list(queries), k)

    def describe(self) -> dict[str, Any]:
        started = time.perf_counter()
        health = self.handle.health.remote().result(timeout_s=60)
        return {"backend": "serve", "deployment": self.name,
                "health": {**health, "seconds": round(time.perf_counter() - started, 3)}}  # fmt: skip

    def shutdown(self) -> None:
        """Nothing to stop: the deployment outlives the job."""
