"""The retrieval contract between the agents and the retrieval service.

``Retriever`` is what the agents call (``search``). A job's own retrieval service
(``raypipe.runtime.retrieval.open_retrieval``) is a :class:`RetrievalService`: it also stops what the job
started (``shutdown``), and is either a :class:`ReplicaService` (replicas started for the job: the index they
hold and where they were placed) or a :class:`SharedRetrievalService` (a deployment or server that outlives
the job: ``describe`` says where it is and what it reports). Callers tell them apart with ``isinstance``. A search that
fails because its query crashes the service raises :class:`QueryCrashError`; any other failure is an outage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SearchHit:
    doc_id: str
    score: float
    title: str
    text: str


@dataclass(frozen=True)
class SearchResult:
    """The ranked list for one query, best first (``deep_k`` long; the agent reads the top ``top_k``)."""

    query: str
    hits: list[SearchHit] = field(default_factory=list)
    empty_query: bool = False  # the query was empty or whitespace: no search was run


class QueryCrashError(RuntimeError):
    """A query killed a retrieval replica even when it ran alone on it (``retrieval.actors.max_query_crashes``): its
    search fails, the client does not send it again, and the agent loop writes the row as ``query_crash``
    (the question's own failure, which a rerun keeps)."""


@runtime_checkable
class Retriever(Protocol):
    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """One result per query, in order."""
        ...


@runtime_checkable
class RetrievalService(Retriever, Protocol):
    def shutdown(self) -> None:
        """Stop what the job started (nothing, for a shared service)."""
        ...


@runtime_checkable
class ReplicaService(RetrievalService, Protocol):
    """Replicas started for this job over the index at ``index_path``."""

    index_path: str
    node_ids: list[str | None]  # the Ray node of each replica


@runtime_checkable
class SharedRetrievalService(RetrievalService, Protocol):
    """A service that outlives the job (a Ray Serve deployment, an HTTP server)."""

    def describe(self) -> dict[str, Any]:
        """For the run's info: where searches go and what the service reports (raises if it is down)."""
        ...
