"""A run config's agent: its protocol and its loop."""

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
    top_k = config.retrieval.top_k
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
