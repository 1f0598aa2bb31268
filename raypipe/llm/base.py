"""One interface over every generation backend (vLLM, transformers, OpenAI-compatible HTTP).

Agents build raw prompt strings (chat templates applied by the agent through the engine's tokenizer)
and ask for continuations. Every backend honours the same request fields, so a trajectory is the same
text whichever backend produced it (greedy, float32). What differs between backends is declared on the
protocol and stated by each of them: ``supports_regex`` (structured outputs) and ``warmup`` (what it
prepares before real requests).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


class EngineError(RuntimeError):
    """The engine failed on one request, and would fail it again: it refused the request (a malformed or
    unsupported request, one its server rejects with a 4xx) or failed on it while up. The agent records the
    row as ``internal_error``, which a rerun keeps."""


class EngineUnavailableError(EngineError):
    """The engine could not answer the request: its server could not be reached, timed out, answered 429 or
    5xx (after the backend's retries) or something that is not a completion; or the engine aborted the
    request while up. An outage, not the request's failure: the agent records the row as ``engine_error``,
    which a rerun runs again."""


class EngineDiedError(EngineError):
    """The engine itself is gone (its process died or it hit a fatal error): no request on it can succeed.

    Not a row's failure: the generation actor fails itself, so Ray restarts it with a new engine and its
    batches run again (``raypipe/stages/probe.py``)."""


class ContextOverflowError(EngineError):
    """The prompt (plus the tokens asked for) does not fit the model's context window."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str  # raw text; the backend adds no template and no BOS beyond the tokenizer's own
    max_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # generation ends at the first of these; the text excludes it
    logprobs: bool = False  # return the log-probability of each generated token
    regex: str | None = None  # structured-output constraint over the continuation
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    text: str  # the continuation, without the matched stop string
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] | None = None
    finish_reason: str = "stop"  # "stop" (stop string or EOS) or "length"
    stop_string: str | None = None  # which stop string ended it, if any
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None  # prefix-cache hits, where the backend reports them
    # Where the backend reports them: seconds the request waited in the engine's queue, and seconds from
    # its first scheduling to its last token (prefill + decode, other requests' steps interleaved).
    queue_s: float | None = None
    engine_s: float | None = None


class Engine(Protocol):
    max_model_len: int
    supports_regex: bool  # honours GenerationRequest.regex (structured outputs)

    async def generate(self, request: GenerationRequest) -> Generation:
        """Continue one prompt. Raises ContextOverflowError or EngineError for this request only."""
        ...

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str: ...

    def count_tokens(self, text: str) -> int: ...

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        """Prepare for the requests to come, whose enforcement regexes are ``regexes``; returns seconds per
        step (``{}`` for a backend with nothing to prepare). vLLM compiles each regex's grammar here: it
        gives up on a request whose grammar takes longer than its timeout."""
        ...

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache, where it has one it controls; returns whether it was emptied
        (benchmarks: runs on one engine must not inherit each other's cache)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a run records about this engine (``raypipe.llm.common.engine_record`` and the backend's own
        settings)."""
        ...

    async def close(self) -> None: ...
