"""Agent protocols (Search-R1, R1-Searcher) and the agent loop with in-trajectory probing.

``build_loop(config, engine, retriever)`` (:mod:`raypipe.agents.factory`) runs a run config's agent;
the loop itself takes any engine and retriever (tests pass fakes).
"""

from __future__ import annotations

from raypipe.core.lazy import lazy_exports

# Each name loads on first use: the Stop-RAG network imports raypipe.agents.hooks without the loop's tables.
__getattr__, __dir__ = lazy_exports(
    __name__,
    globals(),
    {
        "factory": ("build_loop", "build_protocol"),
        "loop": ("AgentLoop", "TrajectoryOutput"),
        "protocol": ("Action", "AgentProtocol"),
        "r1_searcher": ("R1Searcher",),
        "search_r1": ("SearchR1",),
    },
)

__all__ = [
    "Action",
    "AgentLoop",
    "AgentProtocol",
    "R1Searcher",
    "SearchR1",
    "TrajectoryOutput",
    "build_loop",
    "build_protocol",
]
