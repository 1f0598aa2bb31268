"""Agent protocols (Search-R1, R1-Searcher) and the agent loop with in-trajectory probing.

``build_loop(config, engine, retriever)`` (:mod:`raypipe.agents.factory`) runs a run config's agent;
the loop itself takes any engine and retriever (tests pass fakes).
"""

from __future__ import annotations

from raypipe.agents.factory import build_loop, build_protocol, visible_docs
from raypipe.agents.loop import AgentLoop, TrajectoryOutput
from raypipe.agents.protocol import Action, AgentProtocol
from raypipe.agents.r1_searcher import R1Searcher
from raypipe.agents.search_r1 import SearchR1

__all__ = [
    "Action",
    "AgentLoop",
    "AgentProtocol",
    "R1Searcher",
    "SearchR1",
    "TrajectoryOutput",
    "build_loop",
    "build_protocol",
    "visible_docs",
]
