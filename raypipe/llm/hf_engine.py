"""transformers backend: the reference implementation the vLLM backend is checked against.

A plain decoding loop with a KV cache, one request at a time (requests from concurrent trajectories
queue on a lock), so stopping and log-probabilities follow exactly the rules vLLM applies: stop strings
are checked on the detokenized continuation after every token, the first one found ends generation and
is cut from the text (its tokens stay in ``token_ids``, as in vLLM); EOS ends generation and is kept in
``token_ids`` but not in the text; log-probabilities are those of the raw model distribution (before
temperature and top-p), like vLLM's default ``raw_logprobs``. Regex enforcement is not supported.
Cost fields: no prefix cache (``cached_prompt_tokens`` 0), queue time = the wait for the lock, engine time =
the decoding loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from raypipe.core.config import EngineConfig
from raypipe.core.models import engine_model
from raypipe.llm.base import EngineError, Generation, GenerationRequest
from raypipe.llm.common import LocalTokenizer, check_request, engine_record, find_stop, fit_max_tokens, resolve_dtype

log = logging.getLogger(__name__)


class TransformersEngine:
    """The :class:`~raypipe.llm.base.Engine` over a Hugging Face causal LM (CPU or one GPU)."""

    supports_regex = False

    def __init__(self, config: EngineConfig, device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        self.config = config
        self.max_model_len = config.max_model_len
        self.model_path = engine_model(config)
        self.tokenizer = LocalTokenizer(self.model_path)
        started = time.perf_counter()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = resolve_dtype(config.dtype, on_cpu=self.device == "cpu")
        dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=dtype)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types .to as unbound
        self.eos_ids = _eos_ids(self.model, self.tokenizer.tokenizer)
        self._lock = threading.Lock()
        self.start_seconds = time.perf_counter() - started
        log.info(
            "transformers engine for %s (%s) loaded in %.1f s", self.model_path.name, self.dtype, self.start_seconds
        )

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt)

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count_tokens(text)

    async def generate(self, request: GenerationRequest) -> Generation:
        check_request(request)
        if request.regex is not None:
            raise EngineError("the transformers backend does not support regex enforcement; use engine.backend=vllm")
        prompt_ids = self.tokenizer.encode(request.prompt)
        if not prompt_ids:
            raise EngineError("empty prompt")
        max_tokens = fit_max_tokens(len(prompt_ids), request.max_tokens, self.max_model_len)
        try:
            return await asyncio.to_thread(self._generate_locked, prompt_ids, request, max_tokens)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"transformers generation failed: {type(exc).__name__}: {exc}") from exc

    def _generate_locked(self, prompt_ids: list[int], request: GenerationRequest, max_tokens: int) -> Generation:
        """One request under the engine's lock; its wait for the lock is the queue time, the rest engine time."""
        arrived = time.perf_counter()
        with self._lock:
            started = time.perf_counter()
            gen = self._generate(prompt_ids, request, max_tokens)
            return replace(gen, queue_s=started - arrived, engine_s=time.perf_counter() - started)

    def _generate(self, prompt_ids: list[int], request: GenerationRequest, max_tokens: int) -> Generation:
        import torch

        seed = request.seed if request.seed is not None else self.config.seed
        generator = torch.Generator(device=self.device).manual_seed(seed)
        inputs = torch.tensor([prompt_ids], device=self.device)
        past = None
        token_ids: list[int] = []
        logprobs: list[float] = []
        text, finish, stop_string = "", "length", None
        with torch.inference_mode():
            for _ in range(max_tokens):
                out = self.model(input_ids=inputs, past_key_values=past, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                token = _sample(logits, request.temperature, request.top_p, generator)
                token_ids.append(token)
                if request.logprobs:
                    logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
                if token in self.eos_ids:
                    finish = "stop"
                    break
                if request.stop:
                    previous, text = len(text), self.tokenizer.decode(token_ids)
                    hit = find_stop(text, request.stop, max(len(text) - previous, 0))
                    if hit is not None:
                        text, stop_string, finish = text[: hit[0]], hit[1], "stop"
                        break
                inputs = torch.tensor([[token]], device=self.device)
        if stop_string is None:
            text = self.tokenizer.decode(token_ids)  # skips special tokens: EOS is not in the text, as in vLLM
        return Generation(
            text=text,
            token_ids=token_ids,
            token_logprobs=logprobs if request.logprobs else None,
            finish_reason=finish,
            stop_string=stop_string,
            prompt_tokens=len(prompt_ids),
            cached_prompt_tokens=0,  # no prefix cache: every request prefills its whole prompt
        )

    async def warmup(self, regexes: Iterable[str] = ()) -> dict[str, float]:
        """Nothing to prepare (no regex enforcement)."""
        return {}

    async def reset_prefix_cache(self) -> bool:
        """No prefix cache to empty."""
        return False

    def describe(self) -> dict[str, Any]:
        return engine_record(self, self.config, self.model_path, self.dtype, self.start_seconds)

    async def close(self) -> None:
        self.model = None


def _sample(logits, temperature: float, top_p: float, generator) -> int:
    """Greedy at temperature 0, else nucleus sampling over the temperature-scaled distribution."""
    import torch

    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def _eos_ids(model, tokenizer) -> set[int]:
    """Token ids that end generation: the generation config's EOS (one id or a list) and the tokenizer's."""
    ids = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
