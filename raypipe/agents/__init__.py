"""Agent protocols (Search-R1, R1-Searcher) and the agent loop with in-trajectory probing.

``build_protocol(config.agent)`` and ``loop_settings(config)`` turn a run config into what
:class:`AgentLoop` needs; the loop itself takes any engine and retriever (tests pass fakes).
"""

from __future__ import annotations

from raypipe.agents.loop import AgentLoop, LoopSettings, TrajectoryOutput
from raypipe.agents.protocol import Action, AgentProtocol, EnforcementBounds
from raypipe.agents.r1_searcher import R1Searcher
from raypipe.agents.search_r1 import SearchR1
from raypipe.core.config import AgentConfig, RunConfig

PROTOCOLS = {"search_r1": SearchR1, "r1_searcher": R1Searcher}


def build_protocol(agent: AgentConfig) -> AgentProtocol:
    if agent.protocol == "r1_searcher":
        return R1Searcher(agent.observation_format, agent.prompt_version)
    return PROTOCOLS[agent.protocol](agent.observation_format)


def loop_settings(config: RunConfig, protocol: AgentProtocol | None = None) -> LoopSettings:
    """The loop's settings; turn limit and visible documents default to the protocol's own."""
    agent = config.agent
    protocol = protocol or build_protocol(agent)
    return LoopSettings(
        max_turns=agent.max_turns or protocol.default_max_turns,
        top_k=config.retrieval.top_k or protocol.default_top_k,
        deep_k=max(config.retrieval.deep_k, config.retrieval.top_k or protocol.default_top_k),
        max_new_tokens=agent.max_new_tokens,
        temperature=agent.temperature,
        enforcement=agent.enforcement,
        bounds=EnforcementBounds(agent.enforce_think_chars, agent.enforce_query_chars, agent.enforce_answer_chars),
        probe=agent.probe,
        probe_max_tokens=agent.probe_max_tokens,
        at_limit=agent.at_limit,
        metric_rule=agent.metric,
        seed=config.seed,
    )


__all__ = [
    "Action",
    "AgentLoop",
    "AgentProtocol",
    "EnforcementBounds",
    "LoopSettings",
    "PROTOCOLS",
    "R1Searcher",
    "SearchR1",
    "TrajectoryOutput",
    "build_protocol",
    "loop_settings",
]
