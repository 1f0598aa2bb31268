"""OpenAI-compatible HTTP backend: a served model behind ``POST {base_url}/completions``.

For black-box deployments (a vLLM or other OpenAI-compatible server). The API key is read from the
environment variable named by ``engine.api_key_env`` (no ``Authorization`` header when it is unset, as
local servers usually need none). The chat template and token counts need a local tokenizer: the
``engine.tokenizer`` reference, else ``engine.model`` when it resolves to a local model (embedded name,
folder or GGUF); with neither, ``apply_chat_template``/``count_tokens`` raise :class:`EngineError` and
the context budget is left to the server. With a tokenizer, ``max_tokens`` is clamped like the other
backends (``common.py``). Transient failures (connection errors, timeouts, HTTP 408, 409, 429 and 5xx) are
retried with exponential backoff. A request the server refuses (HTTP 400, 413, 422: the request's own
fault, sent again it fails again) becomes an :class:`EngineError` for that request (the row's
``internal_error``); the rest (retries spent, another 4xx or 5xx such as a wrong key or model, an answer
that is not a completion) an :class:`EngineUnavailableError` (the row's ``engine_error``: an outage that a
rerun retries).

Server extensions used when present: ``stop_reason`` (which stop string matched; vLLM reports it) and
``usage.prompt_tokens_details.cached_tokens``. A request with ``regex`` sends vLLM's
``structured_outputs={"regex": ...}`` field, which only a vLLM server understands.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Any

from raypipe.core.config import EngineConfig
from raypipe.core.models import ModelNotFoundError, resolve_llm
from raypipe.llm.base import ContextOverflowError, EngineError, EngineUnavailableError, Generation, GenerationRequest
from raypipe.llm.common import LocalTokenizer, check_request, engine_record, fit_max_tokens

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
REJECTED_STATUS = {400, 413, 422}  # the server refuses this request as it is: sent again, it fails again
OVERFLOW_HINTS = ("context length", "context window", "maximum context", "too many tokens", "max_model_len")


class _Retryable(Exception):
    pass


def completion_body(request: GenerationRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """The JSON body of one ``/completions`` call."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    if request.logprobs:
        body["logprobs"] = 0  # the sampled token's log-probability only
    if request.regex is not None:
        body["structured_outputs"] = {"regex": request.regex}
    return body


def parse_completion(payload: dict[str, Any], request: GenerationRequest, prompt_tokens: int | None) -> Generation:
    """Our ``Generation`` from a ``/completions`` response body."""
    try:
        choice = payload["choices"][0]
        text = choice["text"]
    except (KeyError, IndexError, TypeError) as exc:
        raise EngineUnavailableError(f"malformed completion response: {str(payload)[:200]}") from exc
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    logprobs = None
    if request.logprobs:
        logprobs = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    reason = choice.get("stop_reason")
    return Generation(
        text=text,
        token_ids=list(choice.get("token_ids") or []),
        token_logprobs=logprobs,
        finish_reason=finish,
        stop_string=reason if finish == "stop" and reason in request.stop else None,
        prompt_tokens=int(usage.get("prompt_tokens") or prompt_tokens or 0),
        cached_prompt_tokens=details.get("cached_tokens"),
    )


class OpenAIEngine:
    """The :class:`~raypipe.llm.base.Engine` over an OpenAI-compatible completions endpoint."""

    supports_regex = True  # vLLM servers only

    def __init__(self, config: EngineConfig, backoff_s: float = 0.5):
        if not config.base_url:
            raise EngineError("engine.backend=openai needs engine.base_url")
        self.config = config
        self.max_model_len = config.max_model_len
        self.url = config.base_url.rstrip("/") + "/completions"
        self.model = config.served_model or config.model
        self.backoff_s = backoff_s
        self.tokenizer = _local_tokenizer(config)
        self.model_path = self.tokenizer.path if self.tokenizer else None
        key = os.environ.get(config.api_key_env)
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self._sessions: dict[asyncio.AbstractEventLoop, Any] = {}  # aiohttp sessions belong to one loop
        self.start_seconds = 0.0

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self._need_tokenizer().apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self._need_tokenizer().count_tokens(text)

    def _need_tokenizer(self) -> LocalTokenizer:
        if self.tokenizer is None:
            raise EngineError("no local tokenizer: set engine.tokenizer to a local model folder or embedded name")
        return self.tokenizer

    async def generate(self, request: GenerationRequest) -> Generation:
        check_request(request)
        prompt_tokens, max_tokens = None, request.max_tokens
        if self.tokenizer is not None:
            prompt_tokens = self.tokenizer.count_tokens(request.prompt)
            max_tokens = fit_max_tokens(prompt_tokens, request.max_tokens, self.max_model_len)
        payload = await self._post(completion_body(request, self.model, max_tokens))
        return parse_completion(payload, request, prompt_tokens)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        session = self._session()
        for attempt in range(self.config.max_retries + 1):
            try:
                async with session.post(self.url, json=body, headers=self.headers) as response:
                    text = await response.text()
                    if response.status in RETRY_STATUS:
                        raise _Retryable(f"HTTP {response.status}: {text[:200]}")
                    if response.status >= 400:
                        message = f"HTTP {response.status} from {self.url}: {text[:300]}"
                        if response.status == 400 and any(h in text.lower() for h in OVERFLOW_HINTS):
                            raise ContextOverflowError(message)
                        raise (EngineError if response.status in REJECTED_STATUS else EngineUnavailableError)(message)
                    try:
                        return await response.json(content_type=None)
                    except ValueError as exc:
                        raise EngineUnavailableError(f"response from {self.url} is not JSON: {text[:200]}") from exc
            except (TimeoutError, _Retryable, aiohttp.ClientError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                if attempt == self.config.max_retries:
                    raise EngineUnavailableError(f"{self.url} failed after {attempt + 1} attempts: {problem}") from exc
                delay = self.backoff_s * 2**attempt
                log.warning("%s (attempt %d), retrying in %.1f s", problem, attempt + 1, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _session(self):
        import aiohttp

        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
            session = self._sessions[loop] = aiohttp.ClientSession(timeout=timeout)
        return session

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        """Nothing to prepare here: the server compiles grammars on its side."""
        return {}

    async def reset_prefix_cache(self) -> bool:
        """The server's cache is not this client's to empty."""
        return False

    def describe(self) -> dict[str, Any]:
        return {
            **engine_record(self, self.config, self.model_path, self.config.dtype, self.start_seconds),
            "base_url": self.config.base_url,
            "served_model": self.model,
        }

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for owner, session in list(self._sessions.items()):
            if owner is loop:
                await session.close()
        self._sessions.clear()


def _local_tokenizer(config: EngineConfig) -> LocalTokenizer | None:
    ref = config.tokenizer or config.model
    try:
        return LocalTokenizer(resolve_llm(ref))
    except ModelNotFoundError:
        if config.tokenizer:
            raise
        log.info("no local tokenizer for %r: chat template and token counts unavailable", ref)
        return None
