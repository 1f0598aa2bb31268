"""The retrieval contract between the agents and the retrieval service."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


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


class Retriever(Protocol):
    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        """One result per query, in order."""
        ...
