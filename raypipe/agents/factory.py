"""A run config's agent: its protocol, the documents it reads per search, and its loop."""

from __future__ import annotations

from raypipe.agents.barrier import TurnBarrier
from raypipe.agents.hooks import StopController
from raypipe.agents.loop import AgentLoop
from raypipe.agents.protocol import AgentProtocol
from raypipe.agents.r1_searcher import R1Searcher
from raypipe.agents.search_r1 import SearchR1
from raypipe.core.config import AgentConfig, RunConfig
from raypipe.llm.base import Engine
from raypipe.retrieval.types import Retriever


def build_protocol(agent: AgentConfig) -> AgentProtocol:
    if agent.protocol == "r1_searcher":
        return R1Searcher(agent.observation_format, agent.prompt_version)
    return SearchR1(agent.observation_format)


def visible_docs(config: RunConfig, protocol: AgentProtocol | None = None) -> int:
    """Documents the agent reads per search: ``retrieval.top_k``, else the protocol's default."""
    return config.retrieval.top_k or (protocol or build_protocol(config.agent)).default_top_k


def build_loop(
    config: RunConfig,
    engine: Engine,
    retriever: Retriever,
    protocol: AgentProtocol | None = None,
    controller: StopController | None = None,
    barrier: TurnBarrier | None = None,
) -> AgentLoop:
    """The loop of ``config``'s agent; a search retrieves ``retrieval.deep_k`` documents, at least those it reads."""
    protocol = protocol or build_protocol(config.agent)
    top_k = visible_docs(config, protocol)
    return AgentLoop(
        engine,
        retriever,
        protocol,
        config.agent,
        top_k=top_k,
        deep_k=max(config.retrieval.deep_k, top_k),
        seed=config.seed,
        controller=controller,
        barrier=barrier,
    )
