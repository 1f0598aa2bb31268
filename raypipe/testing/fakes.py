"""Scripted fakes for the agent loop: an engine that answers from a script, a retriever over generated hits,
a controller that stops where told.

Public test support: use them to test your own agent, stop controller, engine wrapper or retriever without a
model or an index (the fakes follow the ``Engine``, ``Retriever`` and controller protocols and pickle, so
they also run inside Ray actors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.rows import OnlineRow
from raypipe.llm.base import EngineError, EngineUnavailableError, Generation, GenerationRequest
from raypipe.llm.common import engine_record, fit_max_tokens
from raypipe.retrieval.types import QueryCrashError, SearchHit, SearchResult

TEMPLATE = "<|user|>{content}<|assistant|>\n"


class FakeEngine:
    """``script(request)`` returns the continuation text (or raises); stop strings are applied like vLLM.

    Tokens are whitespace-separated words; every generated token has log-prob -0.5. The context budget
    follows the engines' policy (``raypipe.llm.common.fit_max_tokens``).
    """

    supports_regex = True  # accepts GenerationRequest.regex (and ignores it)

    def __init__(self, script: Callable[[GenerationRequest], str], max_model_len: int = 10_000):
        self.script = script
        self.max_model_len = max_model_len
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        max_tokens = fit_max_tokens(self.count_tokens(request.prompt), request.max_tokens, self.max_model_len)
        text = self.script(request)
        stop_string = None
        cuts = [(text.find(s), s) for s in request.stop if s in text]
        if cuts:
            at, stop_string = min(cuts)
            text = text[:at]
        words = text.split()[:max_tokens]
        n = len(words)
        return Generation(
            text=text,
            token_ids=list(range(n)),
            token_logprobs=[-0.5] * n if request.logprobs else None,
            stop_string=stop_string,
            prompt_tokens=self.count_tokens(request.prompt),
        )

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(TEMPLATE.format(content=m["content"]) for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        return {}

    async def reset_prefix_cache(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        return engine_record(self, None)

    async def close(self) -> None:
        pass


def replies(outputs: Iterable[str | Exception]) -> Callable[[GenerationRequest], str]:
    """A script: each request gets the next of ``outputs`` (taken when the script is made); an exception
    among them is raised instead."""
    queue = list(outputs)

    def script(request: GenerationRequest) -> str:
        if not queue:
            raise AssertionError("the engine got more requests than scripted")
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return script


def agent_turns(turns: Sequence[str | Exception], probe: Callable[[str], str] | str = " yes </answer>") -> Callable:
    """A script: agent requests get ``turns`` in order; probe requests (prompt ends with ``<answer>``) get ``probe``."""
    agent = replies(turns)

    def script(request: GenerationRequest) -> str:
        if request.prompt.endswith("<answer>"):
            return probe(request.prompt) if callable(probe) else probe
        return agent(request)

    return script


def hit(doc_id: str, title: str = "T", text: str = "text", score: float = 1.0) -> SearchHit:
    return SearchHit(doc_id=doc_id, score=score, title=title, text=text)


class FakeRetriever:
    """Each query gets ``n`` hits ``<query>-0 .. <query>-(n-1)``; ``fail_on`` queries raise as in an outage
    (``ConnectionError``), ``crash_on`` queries as a query that crashes its replica (``QueryCrashError``)."""

    def __init__(self, n: int = 5, fail_on: Sequence[str] = (), crash_on: Sequence[str] = ()):
        self.n, self.fail_on, self.crash_on = n, set(fail_on), set(crash_on)
        self.calls: list[tuple[list[str], int]] = []

    async def search(self, queries: Sequence[str], k: int) -> list[SearchResult]:
        self.calls.append((list(queries), k))
        if self.fail_on & set(queries):
            raise ConnectionError("retrieval service down")
        if self.crash_on & set(queries):
            raise QueryCrashError("in flight at 3 retrieval replica deaths, the last one alone")
        return [
            SearchResult(
                query=q,
                hits=[
                    hit(f"{q}-{i}", f"Title {i}", f"passage {i} about {q}", 1.0 - i / 10) for i in range(min(k, self.n))
                ],
            )
            for q in queries
        ]


class ScriptedController:
    """Stops at iteration ``at`` returning iteration ``answer_iteration``'s probe; records what it saw."""

    def __init__(self, at: int, answer_iteration: int | None = None):
        self.at, self.answer_iteration = at, answer_iteration
        self.histories: list[list[OnlineRow]] = []

    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision:
        self.histories.append(history)
        if history[-1]["iteration"] == self.at:
            return StopDecision(stop=True, answer_iteration=self.answer_iteration, reason="scripted")
        return CONTINUE


__all__ = [
    "EngineError",
    "EngineUnavailableError",
    "FakeEngine",
    "FakeRetriever",
    "ScriptedController",
    "agent_turns",
    "hit",
    "replies",
]
